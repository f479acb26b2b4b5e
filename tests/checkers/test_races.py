"""checkers/races.py's RaceChecker on its own: the happens-before contract the engine drives.

The engine tells the checker what a TPU does (engine/call/state.py): a core's accesses in
program order; a DMA is an actor of its own, forked by the core at its start (everything
the core did before the start happens before the DMA's read and write); the DMA releases
its send semaphore after reading its source and its receive semaphore after writing its
destination, then ends; a core's wait acquires what was released to that semaphore; a
pipeline block copy is joined when the core waits for it. Two accesses race when neither
happens before the other, they overlap in at least one element and one of them writes.

Each test drives the checker by hand with a few accesses (no kernel, no JAX), so a broken
rule shows as one small failing case. Buffers are stand-ins with the three attributes the
checker reads (name, memory space, a unique id)."""

from __future__ import annotations

import dataclasses

from pallas_check.checkers.races import RaceChecker
from pallas_check.engine.events import Access, CallFacts, LoopIteration, ParallelLoop
from pallas_check.findings.finding import Finding, FindingKind, KernelInfo, SourceFrame

FRAMES = (SourceFrame("kernel.py", 7, "kernel"),)
ROWS = ((0, 8), (0, 128))  # an (8, 128) block


@dataclasses.dataclass(frozen=True)
class StubBuffer:
    """What an Access event carries of a buffer: its name, memory space and identity."""

    name: str
    space: str = "vmem"
    id: int = 0


X = StubBuffer("x", "vmem", 1)
Y = StubBuffer("y", "hbm", 2)


class _Found(list):
    """The sink the checker emits into (engine/events.py FindingSink)."""

    def emit(self, finding: Finding) -> None:
        self.append(finding)


def checker() -> tuple[RaceChecker, list[Finding]]:
    """A RaceChecker whose findings land in the returned list."""
    found = _Found()
    return RaceChecker(CallFacts(KernelInfo("kernel"), 0, None, True), found), found


def _access(races: RaceChecker, actor: str, buffer: StubBuffer, rng, is_write: bool,
            operation: str) -> None:
    races.on_access(Access(actor, buffer.id, buffer.name, buffer.space, rng, is_write,
                           operation, FRAMES, None))


def read(races: RaceChecker, actor: str, buffer: StubBuffer, rng, operation: str = "read"):
    _access(races, actor, buffer, rng, False, operation)


def write(races: RaceChecker, actor: str, buffer: StubBuffer, rng, operation: str = "write"):
    _access(races, actor, buffer, rng, True, operation)


# -- what conflicts: one writer, at least one shared element -------------------------------

def test_program_order_never_races():
    races, found = checker()
    write(races, "core0", X, ROWS)
    read(races, "core0", X, ROWS)
    write(races, "core0", X, ROWS)
    assert found == []


def test_two_unordered_writers_race_on_exactly_the_shared_elements():
    races, found = checker()
    write(races, "core0", X, ((0, 8), (0, 128)))
    write(races, "core1", X, ((4, 12), (64, 256)))
    [race] = found
    assert race.kind is FindingKind.RACE
    assert race.buffer == "x" and race.memory_space == "vmem"
    assert race.index_range == ((4, 8), (64, 128))
    assert race.actor == "core1"  # the access that completed the race
    current, previous = race.accesses
    assert (current.actor, current.operation) == ("core1", "write")
    assert (previous.actor, previous.operation) == ("core0", "write")
    assert current.index_range == previous.index_range == ((4, 8), (64, 128))


def test_a_read_and_a_write_race_in_either_order():
    races, found = checker()
    read(races, "core0", X, ROWS)
    write(races, "core1", X, ROWS)
    assert [(f.accesses[0].operation, f.accesses[1].operation) for f in found] == [
        ("write", "read")]
    races, found = checker()
    write(races, "core0", X, ROWS)
    read(races, "core1", X, ROWS)
    assert [(f.accesses[0].operation, f.accesses[1].operation) for f in found] == [
        ("read", "write")]


def test_unordered_reads_never_race():
    races, found = checker()
    read(races, "core0", X, ROWS)
    read(races, "core1", X, ROWS)
    read(races, "core2", X, ((2, 3), (0, 1)))
    assert found == []


def test_adjacent_and_disjoint_ranges_share_no_element():
    """Ranges are half-open per dimension: rows [0, 4) and [4, 8) do not touch."""
    races, found = checker()
    write(races, "core0", X, ((0, 4), (0, 128)))
    write(races, "core1", X, ((4, 8), (0, 128)))
    write(races, "core1", X, ((0, 4), (128, 256)))
    assert found == []


def test_other_buffers_never_conflict():
    races, found = checker()
    write(races, "core0", X, ROWS)
    write(races, "core1", Y, ROWS)
    assert found == []


def test_an_empty_range_is_no_access():
    races, found = checker()
    write(races, "core0", X, ((3, 3), (0, 128)))
    write(races, "core1", X, ((0, 8), (0, 128)))
    read(races, "core0", X, ((0, 8), (5, 5)))
    assert found == []
    assert races.checked == 3  # counted as checked, recorded nowhere


# -- semaphores: release on signal, acquire on wait --------------------------------------

def test_a_signal_and_its_wait_order_the_accesses_around_them():
    races, found = checker()
    write(races, "core0", X, ROWS)
    races.release("core0", "sem")
    races.acquire("core1", "sem")
    read(races, "core1", X, ROWS)
    write(races, "core1", X, ROWS)
    assert found == []


def test_a_wait_on_another_semaphore_orders_nothing():
    races, found = checker()
    write(races, "core0", X, ROWS)
    races.release("core0", "sem A")
    races.acquire("core1", "sem B")
    read(races, "core1", X, ROWS)
    assert len(found) == 1


def test_an_access_after_the_signal_is_not_ordered_by_it():
    races, found = checker()
    races.release("core0", "sem")
    write(races, "core0", X, ROWS)
    races.acquire("core1", "sem")
    read(races, "core1", X, ROWS)
    assert len(found) == 1


def test_a_wait_before_the_signal_orders_nothing():
    """An acquire takes only what was released so far (the engine calls it after the
    wait's count is there, so this is a wait that came too early)."""
    races, found = checker()
    races.acquire("core1", "sem")
    write(races, "core0", X, ROWS)
    races.release("core0", "sem")
    read(races, "core1", X, ROWS)
    assert len(found) == 1


def test_happens_before_is_transitive_across_actors():
    races, found = checker()
    write(races, "core0", X, ROWS)
    races.release("core0", "s01")
    races.acquire("core1", "s01")
    races.release("core1", "s12")
    races.acquire("core2", "s12")
    write(races, "core2", X, ROWS)
    assert found == []


# -- DMAs: forked at their start, release their semaphores, end after landing ---------------

def start_dma(races: RaceChecker, core: str, dma: str) -> None:
    races.fork(core, dma)


def dma_reads(races: RaceChecker, dma: str, src: StubBuffer, send_sem: str | None = None):
    read(races, dma, src, ROWS, "DMA read")
    if send_sem is not None:
        races.release(dma, send_sem)


def dma_lands(races: RaceChecker, dma: str, dst: StubBuffer, recv_sem: str) -> None:
    write(races, dma, dst, ROWS, "DMA write")
    races.release(dma, recv_sem)
    races.end(dma)


def test_what_the_core_did_before_a_start_happens_before_the_dma():
    races, found = checker()
    write(races, "core0", X, ROWS)  # fills the source
    read(races, "core0", Y, ROWS)  # reads the destination's old values
    start_dma(races, "core0", "dma0")
    dma_reads(races, "dma0", X)
    dma_lands(races, "dma0", Y, "recv")
    assert found == []


def test_a_dma_races_with_what_its_core_does_after_the_start():
    """Until the wait, the DMA's read and write are concurrent with the core: writing the
    source or reading the destination before the wait is a race on a TPU."""
    races, found = checker()
    start_dma(races, "core0", "dma0")
    write(races, "core0", X, ROWS)  # overwrites the source while the DMA may read it
    dma_reads(races, "dma0", X)
    dma_lands(races, "dma0", Y, "recv")
    read(races, "core0", Y, ROWS)  # reads the destination before waiting
    assert [(f.buffer, f.accesses[0].operation, f.accesses[1].operation) for f in found] == [
        ("x", "DMA read", "write"), ("y", "read", "DMA write")]


def test_waiting_on_the_receive_semaphore_orders_the_landing_before_the_core():
    races, found = checker()
    start_dma(races, "core0", "dma0")
    dma_reads(races, "dma0", X, send_sem="send")
    dma_lands(races, "dma0", Y, "recv")
    races.acquire("core0", "recv")
    read(races, "core0", Y, ROWS)
    write(races, "core0", X, ROWS)  # the DMA's read came before its landing
    assert found == []


def test_waiting_on_the_send_semaphore_frees_only_the_source():
    """A remote copy's sender waits on its send semaphore: the source may then be
    rewritten, but the destination's landing is not ordered by that wait."""
    races, found = checker()
    start_dma(races, "core0", "dma0")
    dma_reads(races, "dma0", X, send_sem="send")
    races.acquire("core0", "send")
    write(races, "core0", X, ROWS)
    assert found == []
    dma_lands(races, "dma0", Y, "recv")
    read(races, "core0", Y, ROWS)
    assert [(f.buffer, f.accesses[1].actor) for f in found] == [("y", "dma0")]


def test_two_dmas_in_flight_to_one_destination_race():
    races, found = checker()
    start_dma(races, "core0", "dma0")
    start_dma(races, "core0", "dma1")
    dma_lands(races, "dma1", Y, "recv")
    dma_lands(races, "dma0", Y, "recv")
    [race] = found
    assert (race.accesses[0].actor, race.accesses[1].actor) == ("dma0", "dma1")


def test_a_dma_started_after_waiting_for_another_is_ordered_after_it():
    races, found = checker()
    start_dma(races, "core0", "dma0")
    dma_lands(races, "dma0", Y, "recv")
    races.acquire("core0", "recv")
    start_dma(races, "core0", "dma1")
    dma_lands(races, "dma1", Y, "recv")
    assert found == []


def test_a_finished_dmas_clock_slot_serves_the_next_dma_only_once_waited_for():
    """Slot reuse keeps clocks small; it must never order two DMAs the core did not order."""
    races, found = checker()
    start_dma(races, "core0", "dma0")
    dma_lands(races, "dma0", Y, "recv")  # ended, but the core has not waited
    start_dma(races, "core0", "dma1")
    assert races.slot_of.get("dma1", "dma1") == "dma1"  # a slot of its own
    dma_lands(races, "dma1", Y, "recv")
    assert len(found) == 1  # DMA-DMA race on y, not hidden by a shared slot

    races, found = checker()
    start_dma(races, "core0", "dma0")
    dma_lands(races, "dma0", Y, "recv")
    races.acquire("core0", "recv")
    start_dma(races, "core0", "dma1")
    assert races.slot_of["dma1"] == "dma0"  # reused: dma1 is ordered after dma0 anyway
    dma_lands(races, "dma1", Y, "recv")
    write(races, "core1", Y, ROWS)  # another core, unordered with both DMAs
    assert [f.accesses[1].actor for f in found] == ["dma1"]


def test_joining_a_finished_copy_orders_it_before_the_core():
    """A pipeline block copy: forked, moves its block, ends; the core's wait joins it."""
    races, found = checker()
    races.fork("core0", "copy-in x[0]")
    write(races, "copy-in x[0]", X, ROWS, "DMA write")
    races.end("copy-in x[0]")
    races.join_finished("core0", "copy-in x[0]")
    read(races, "core0", X, ROWS)
    assert found == []
    assert "copy-in x[0]" not in races.clocks  # nothing more of it is kept


def test_reading_a_copys_block_before_joining_it_races():
    races, found = checker()
    races.fork("core0", "copy-in x[0]")
    write(races, "copy-in x[0]", X, ROWS, "DMA write")
    races.end("copy-in x[0]")
    read(races, "core0", X, ROWS)
    assert len(found) == 1


# -- history pruning: what is dropped can race with nothing that the kept cannot -----------

def test_a_covering_ordered_write_replaces_earlier_accesses():
    races, found = checker()
    for _ in range(100):
        read(races, "core0", X, ROWS)
        write(races, "core0", X, ROWS)
    assert len(races.history[X.id]) == 1
    assert races.longest_history() == 2
    read(races, "core1", X, ROWS)
    assert len(found) == 1  # the kept write still races with an unordered reader


def test_a_read_does_not_replace_an_earlier_write():
    """Another actor's later read races with the write, not with the read: the write is
    kept even though the read covers it."""
    races, found = checker()
    write(races, "core0", X, ROWS)
    read(races, "core0", X, ROWS)
    assert len(races.history[X.id]) == 2
    read(races, "core1", X, ROWS)
    [race] = found
    assert race.accesses[1].operation == "write"


def test_a_partial_overwrite_keeps_the_rest_of_the_earlier_write():
    races, found = checker()
    write(races, "core0", X, ((0, 8), (0, 128)))
    write(races, "core0", X, ((0, 4), (0, 128)))
    assert len(races.history[X.id]) == 2
    read(races, "core1", X, ((4, 8), (0, 128)))
    [race] = found
    assert race.index_range == ((4, 8), (0, 128))


def test_an_unordered_covering_write_replaces_nothing():
    races, found = checker()
    write(races, "core0", X, ROWS)
    write(races, "core1", X, ROWS)  # races, and must not hide core0's write
    assert len(found) == 1
    read(races, "core2", X, ROWS)
    assert sorted(f.accesses[1].actor for f in found[1:]) == ["core0", "core1"]


def disjoint_rows(n: int):
    return [((i, i + 1), (0, 128)) for i in range(n)]


def test_disjoint_accesses_stay_until_every_live_actor_has_seen_them():
    """Once the call's cores are declared, a record every live actor has ordered before
    its clock can race with no later access: a sweep drops it, so a long grid keeps a
    bounded history."""
    races, found = checker()
    races.declare(["core0", "core1"])
    for rng in disjoint_rows(300):
        write(races, "core0", X, rng)
        races.release("core0", "step")
        races.acquire("core1", "step")
    assert found == []
    assert len(races.history[X.id]) < 130  # swept each time the history doubles
    assert races.longest_history() < 130

    unswept, _ = checker()
    unswept.declare(["core0", "core1"])
    for rng in disjoint_rows(300):
        write(unswept, "core0", X, rng)  # core1 never sees them: all may still race
    assert len(unswept.history[X.id]) == 300


def test_an_ended_core_no_longer_holds_records_back():
    races, found = checker()
    races.declare(["core0", "core1"])
    races.end("core1")  # its grid is done: it accesses nothing more
    for rng in disjoint_rows(300):
        write(races, "core0", X, rng)
    assert len(races.history[X.id]) < 130


def test_an_actor_never_declared_stops_the_sweep():
    """An actor the checker was not told of may still race with anything: no record may
    be dropped for being seen by the declared ones alone."""
    races, found = checker()
    races.declare(["core0"])
    write(races, "other", X, ((500, 501), (0, 128)))
    for rng in disjoint_rows(300):
        write(races, "core0", X, rng)
    read(races, "other", X, ((0, 1), (0, 128)))
    [race] = found
    assert (race.accesses[1].actor, race.index_range) == ("core0", ((0, 1), (0, 128)))
    assert len(races.history[X.id]) == 302


def test_the_sweep_keeps_what_a_dma_in_flight_has_not_seen():
    """A DMA forked before the writes is live and has not seen them: they are kept, and its
    landing on them races."""
    races, found = checker()
    races.declare(["core0"])
    races.fork("core0", "dma0")
    for rng in disjoint_rows(300):
        write(races, "core0", X, rng)
    write(races, "dma0", X, ((0, 1), (0, 128)), "DMA write")
    [race] = found
    assert (race.accesses[0].actor, race.accesses[1].actor) == ("dma0", "core0")


def test_the_bucket_index_finds_every_overlapping_record():
    """Beyond a few records a history is indexed in buckets along one dimension; an access
    spanning many buckets, or one at the far end, still meets every record it overlaps."""
    races, found = checker()
    for rng in disjoint_rows(200):
        write(races, "core0", X, rng)
    read(races, "core1", X, ((199, 200), (0, 1)))
    read(races, "core1", X, ((50, 150), (0, 128)))
    assert [f.index_range for f in found[:1]] == [((199, 200), (0, 1))]
    assert sorted(f.index_range[0] for f in found[1:]) == [(i, i + 1) for i in range(50, 150)]


# -- atomic adds (scatter-add DMAs, fetch_and_add): add vs add never races ----------------------

def add(races: RaceChecker, actor: str, buffer: StubBuffer, rng, operation: str = "atomic add"):
    races.on_access(Access(actor, buffer.id, buffer.name, buffer.space, rng, True, operation,
                           FRAMES, None, atomic_add=True))


def test_two_atomic_adds_never_race():
    races, found = checker()
    add(races, "core 0", X, ROWS)
    add(races, "core 1", X, ROWS)
    assert found == []


def test_an_atomic_add_races_with_a_plain_read_or_write_either_way():
    for first, second in ((add, read), (read, add), (add, write), (write, add)):
        races, found = checker()
        first(races, "core 0", X, ROWS)
        second(races, "core 1", X, ROWS)
        [race] = found
        assert race.kind == FindingKind.RACE and race.index_range == ROWS


def test_an_atomic_add_does_not_prune_the_plain_write_before_it():
    """core 0 writes, then (ordered after it) adds; core 1's unordered add races with the
    write even though it does not race with the add that covers it."""
    races, found = checker()
    write(races, "core 0", X, ROWS, "write")
    add(races, "core 0", X, ROWS)
    add(races, "core 1", X, ROWS)
    [race] = found
    assert {a.operation for a in race.accesses} == {"atomic add", "write"}


# -- parallel_loop iterations: concurrent with one another, joined at the loop's end ------------

def test_iterations_of_a_parallel_loop_race_and_the_loop_end_orders_them():
    races, found = checker()
    write(races, "core 0", X, ROWS)  # before the loop: ordered before every iteration
    races.on_parallel_loop(ParallelLoop("core 0", True))
    races.on_loop_iteration(LoopIteration("core 0", "it 0", "slot 0", True))
    write(races, "it 0", Y, ((0, 8), (0, 128)))
    read(races, "it 0", X, ROWS)
    races.on_loop_iteration(LoopIteration("core 0", "it 0", "", False))
    races.on_loop_iteration(LoopIteration("core 0", "it 1", "slot 1", True))
    read(races, "it 1", Y, ((0, 8), (0, 128)))  # iteration 0's write: a race
    races.on_loop_iteration(LoopIteration("core 0", "it 1", "", False))
    races.on_parallel_loop(ParallelLoop("core 0", False))
    write(races, "core 0", Y, ((0, 8), (0, 128)))  # after the loop: ordered after both
    [race] = found
    assert {a.actor for a in race.accesses} == {"it 0", "it 1"}
    assert race.buffer == "y"


def test_an_iteration_slot_served_again_starts_after_the_last_one():
    """A slot shared by iterations of a later loop (or ITERATION_SLOTS apart) gives the later
    iteration a larger epoch: no access of it is taken as ordered before the other side."""
    races, found = checker()
    for loop in range(2):
        races.on_parallel_loop(ParallelLoop("core 0", True))
        races.on_loop_iteration(LoopIteration("core 0", f"loop {loop} it 0", "slot 0", True))
        write(races, f"loop {loop} it 0", X, ROWS)
        races.on_loop_iteration(LoopIteration("core 0", f"loop {loop} it 0", "", False))
        races.on_parallel_loop(ParallelLoop("core 0", False))
    assert found == []  # the second loop's write is after the first loop's end
    assert races.clocks["core 0"]["slot 0"] == 2


# -- a repeated access: what the walk it skips would have found ------------------------------

LINE_9 = (SourceFrame("kernel.py", 9, "kernel"),)


def test_a_repeated_read_keeps_the_repeats_line_for_a_later_race():
    """The same actor reading the same element again in the same epoch takes the place of
    its earlier read (the walk would prune it): a later unordered write races with the
    repeat, at the repeat's line, once."""
    races, found = checker()
    read(races, "core0", X, ((3, 4),))
    races.on_access(Access("core0", X.id, X.name, X.space, ((3, 4),), False, "read",
                           LINE_9, None))
    assert len(races.history[X.id]) == 1
    write(races, "core1", X, ((0, 8),))
    [race] = found
    assert race.index_range == ((3, 4),)
    assert race.accesses[1].frames == LINE_9


def test_a_repeat_of_an_access_that_raced_races_again():
    """An access that met a race is walked again when repeated: the same race is found
    at the repeat too (a finding at each line)."""
    races, found = checker()
    write(races, "core1", X, ((0, 8),))
    read(races, "core0", X, ((3, 4),))
    races.on_access(Access("core0", X.id, X.name, X.space, ((3, 4),), False, "read",
                           LINE_9, None))
    assert [f.accesses[0].frames for f in found] == [FRAMES, LINE_9]


def test_a_repeat_after_a_wait_prunes_what_the_wait_ordered():
    """core0's clock learns of core1's read by a wait in between: the repeated read
    covers that read and drops it, so a third actor's write races with core0's alone."""
    races, found = checker()
    read(races, "core1", X, ((3, 4),))
    races.release("core1", "sem")
    read(races, "core0", X, ((3, 4),))
    races.acquire("core0", "sem")  # no tick: the same epoch
    read(races, "core0", X, ((3, 4),))
    assert len(races.history[X.id]) == 1
    write(races, "core2", X, ((3, 4),))
    assert [f.accesses[1].actor for f in found] == ["core0"]


def test_a_repeat_after_another_access_to_the_buffer_is_walked():
    """Not the buffer's newest record: an unordered write in between races with the
    repeat (and with the first read)."""
    races, found = checker()
    read(races, "core0", X, ((3, 4),))
    write(races, "core1", X, ((3, 4),))
    read(races, "core0", X, ((3, 4),))
    assert [(f.accesses[0].actor, f.accesses[1].actor) for f in found] == [
        ("core1", "core0"), ("core0", "core1")]


# -- scalar loads of a table (a history kept by element) ------------------------------------

T = StubBuffer("table", "smem", 3)


def test_a_write_into_one_entry_races_with_the_loads_of_that_entry_alone():
    races, found = checker()
    races.fork("core0", "dma0")  # in flight while the core reads the table
    for i in (5, 3, 1, 3, 7):
        read(races, "core0", T, ((i, i + 1),))
    write(races, "dma0", T, ((3, 4),), "DMA write")
    assert [(f.index_range, f.accesses[1].operation) for f in found] == [
        (((3, 4),), "read")]  # the second load of entry 3 took the place of the first


def test_a_write_of_the_whole_table_races_with_each_entry_loaded_in_load_order():
    races, found = checker()
    races.fork("core0", "dma0")
    for i in (5, 3, 1, 3, 7):
        read(races, "core0", T, ((i, i + 1),))
    write(races, "dma0", T, ((0, 8),), "DMA write")
    assert [f.index_range for f in found] == [((5, 6),), ((1, 2),), ((3, 4),), ((7, 8),)]
