"""A vector clock: what one actor (a core, a DMA, a loop iteration) knows has happened.

The race checker (races.py) keeps one per actor and one per synchronisation object (what
a semaphore or barrier was released with). A clock maps slots to epochs: a slot is an
actor's name, or a slot a finished DMA left for a later one to reuse; the epoch is how
many steps the slot's owner had made. An access is stamped with an epoch, its slot's
value at the time; it happened before a clock that has reached that value in that slot.

Slots a clock has never heard of read as 0, so clocks hold only the slots they know of
(a few cores and the DMAs in flight), not one entry per actor of the call.

The checker calls these for every memory access with races on, so they stay small: one
dict inside, no allocation except where a new clock is the point (`copy`, `forked`).
"""

from __future__ import annotations


class VectorClock:
    """Epochs per slot; absent slots are 0. Mutated in place by `tick` and `join`."""

    __slots__ = ("_epochs",)

    def __init__(self, epochs: dict[str, int] | None = None) -> None:
        self._epochs: dict[str, int] = dict(epochs) if epochs else {}

    @classmethod
    def starting(cls, slot: str) -> VectorClock:
        """A new actor's clock: it knows nothing of others, and is at epoch 1 in its slot
        (so that its first access is not mistaken for one every clock has seen)."""
        clock = cls.__new__(cls)
        clock._epochs = {slot: 1}
        return clock

    def get(self, slot: str) -> int:
        """The epoch of `slot` this clock has reached (0: none of it)."""
        return self._epochs.get(slot, 0)

    def has_seen(self, slot: str, epoch: int) -> bool:
        """Whether the access stamped (`slot`, `epoch`) happened before this clock."""
        return epoch <= self._epochs.get(slot, 0)

    def tick(self, slot: str) -> None:
        """The owner of `slot` takes a step: what it does next is after what it did."""
        epochs = self._epochs
        epochs[slot] = epochs.get(slot, 0) + 1

    def join(self, other: VectorClock) -> None:
        """Learn all `other` knows (pointwise max, in place): an acquire, a wait, a join."""
        epochs = self._epochs
        for slot, epoch in other._epochs.items():
            if epochs.get(slot, 0) < epoch:
                epochs[slot] = epoch

    def copy(self) -> VectorClock:
        """An independent clock that knows the same (a loop's base for its iterations)."""
        clock = VectorClock.__new__(VectorClock)
        clock._epochs = self._epochs.copy()
        return clock

    def forked(self, slot: str, epoch: int) -> VectorClock:
        """A new actor started by the owner of this clock: it knows all this clock knows,
        and is at `epoch` in its own `slot` (one copy, as a fork makes for each child)."""
        clock = VectorClock.__new__(VectorClock)
        epochs = clock._epochs = self._epochs.copy()
        epochs[slot] = epoch
        return clock

    def __bool__(self) -> bool:
        """Whether it knows of anything (a semaphore never released holds an empty one)."""
        return bool(self._epochs)

    def __eq__(self, other: object) -> bool:
        """Same knowledge: every slot at the same epoch (a slot at 0 counts as absent)."""
        if not isinstance(other, VectorClock):
            return NotImplemented
        return ({s: e for s, e in self._epochs.items() if e}
                == {s: e for s, e in other._epochs.items() if e})

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"VectorClock({self._epochs!r})"
