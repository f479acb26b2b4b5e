"""VectorClock (checkers/vector_clock.py): the race checker's happens-before knowledge.

Each operation is checked against the values a vector clock must hold by definition:
a slot's epoch, pointwise max for a join, independence of copies.
"""

from __future__ import annotations

from hypothesis import given, strategies as st

from pallas_check.checkers.races import RaceChecker
from pallas_check.checkers.vector_clock import VectorClock
from pallas_check.engine.events import CallFacts, FindingList
from pallas_check.findings.finding import KernelInfo

SLOTS = st.sampled_from(["core 0", "core 1", "dma0", "dma1", "slot 0"])
EPOCHS = st.dictionaries(SLOTS, st.integers(min_value=0, max_value=50), max_size=5)


def test_a_new_actor_is_at_epoch_1_in_its_slot_and_0_elsewhere():
    clock = VectorClock.starting("core 0")
    assert clock.get("core 0", 0) == 1
    assert clock.get("core 1", 0) == 0
    assert clock == VectorClock({"core 0": 1})


def test_tick_advances_only_the_slot_ticked():
    clock = VectorClock({"core 0": 3, "dma0": 2})
    clock.tick("core 0")
    clock.tick("core 1")  # a slot not yet known starts from 0
    assert clock == VectorClock({"core 0": 4, "dma0": 2, "core 1": 1})


def test_join_takes_the_larger_epoch_of_each_slot_in_place():
    into = VectorClock({"core 0": 5, "dma0": 1})
    other = VectorClock({"core 0": 2, "dma0": 7, "core 1": 3})
    into.join(other)
    assert into == VectorClock({"core 0": 5, "dma0": 7, "core 1": 3})
    assert other == VectorClock({"core 0": 2, "dma0": 7, "core 1": 3})  # untouched


@given(EPOCHS, EPOCHS)
def test_join_is_pointwise_max_and_commutative(a, b):
    ab, ba = VectorClock(a), VectorClock(b)
    ab.join(VectorClock(b))
    ba.join(VectorClock(a))
    for slot in set(a) | set(b) | {"never held"}:
        assert ab.get(slot, 0) == max(a.get(slot, 0), b.get(slot, 0)) == ba.get(slot, 0)
    assert set(ab) <= set(a) | set(b)  # a join adds no slot neither side held


@given(EPOCHS)
def test_join_is_idempotent(a):
    clock = VectorClock(a)
    clock.join(VectorClock(a))
    assert clock == VectorClock(a)


def test_an_epoch_happened_before_a_clock_that_reached_it_in_its_slot():
    clock = VectorClock({"core 0": 4, "dma0": 2})
    assert clock.has_seen("core 0", 4)
    assert clock.has_seen("core 0", 1)
    assert not clock.has_seen("core 0", 5)
    assert not clock.has_seen("core 1", 1)  # a slot never heard of
    assert clock.has_seen("core 1", 0)  # epoch 0: before anything (a DMA that accessed nothing)
    clock.join(VectorClock({"core 1": 1}))
    assert clock.has_seen("core 1", 1)  # learnt through the join


def test_a_copy_is_independent_of_the_original():
    original = VectorClock({"core 0": 2, "dma0": 1})
    copy = original.copy()
    copy.tick("core 0")
    copy.join(VectorClock({"core 1": 9}))
    original.tick("dma0")
    assert copy == VectorClock({"core 0": 3, "dma0": 1, "core 1": 9})
    assert original == VectorClock({"core 0": 2, "dma0": 2})


def test_a_forked_clock_knows_the_parents_past_and_has_its_own_epoch():
    parent = VectorClock({"core 0": 3, "dma0": 5})
    child = parent.forked("dma0", 6)  # a DMA reusing slot dma0 starts after its last epoch
    assert child == VectorClock({"core 0": 3, "dma0": 6})
    child.tick("dma0")
    parent.tick("core 0")
    assert parent == VectorClock({"core 0": 4, "dma0": 5})  # independent of each other
    assert child == VectorClock({"core 0": 3, "dma0": 7})


def test_the_constructor_copies_its_mapping():
    epochs = {"core 0": 1}
    clock = VectorClock(epochs)
    clock.tick("core 0")
    assert epochs == {"core 0": 1}


def test_copies_and_forks_are_vector_clocks_not_plain_dicts():
    """dict's own copy answers a plain dict, which has no join: the type's own do not."""
    clock = VectorClock({"core 0": 1})
    assert type(clock.copy()) is VectorClock
    assert type(clock.forked("dma0", 1)) is VectorClock
    assert type(VectorClock.starting("core 0")) is VectorClock
    assert repr(clock) == "VectorClock({'core 0': 1})"


def test_an_empty_clock_knows_nothing():
    empty = VectorClock()
    assert not empty
    assert not empty.has_seen("core 0", 1)
    empty.join(VectorClock({"core 0": 2}))
    assert empty == VectorClock({"core 0": 2})


def _checker() -> RaceChecker:
    """A race checker of two cores."""
    races = RaceChecker(CallFacts(KernelInfo("kernel"), 0, None, True), FindingList())
    races.declare(["core 0", "core 1"])
    return races


def test_a_cores_wait_for_its_own_dmas_learns_what_the_full_join_learns() -> None:
    """`Released` (issue 55.4): DMAs of core 0 released to one semaphore, out of the order
    they started; core 0's wait joins only their epochs, core 1's the whole clock. Both
    end where joining every released clock, as released, ends."""
    races = _checker()
    for dma in ("d1", "d2", "d3"):
        races.fork("core 0", dma)
        races.acquire("core 0", "other")  # (nothing released there: no change)
    races.release("core 1", "barrier")
    races.acquire("core 0", "barrier")
    races.fork("core 0", "d4")  # started after core 0 learnt core 1's epoch
    expected = VectorClock()
    for dma in ("d3", "d1", "d4", "d2"):  # released out of start order
        expected.join(races.clocks[dma])  # as released (before the release's tick)
        races.release(dma, "sem")
    core0, core1 = races.clock("core 0").copy(), races.clock("core 1").copy()
    core0.join(expected)
    core1.join(expected)
    races.acquire("core 0", "sem")
    races.acquire("core 1", "sem")
    assert races.clock("core 0") == core0
    assert races.clock("core 1") == core1
    assert core1["core 1"] and core1.get("d4") and core1.get("d1")  # (it learnt them all)
