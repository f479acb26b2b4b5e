"""A vector clock: what one actor (a core, a DMA, a loop iteration) knows has happened.

The race checker (races.py) keeps one per actor and one per synchronisation object (what
a semaphore or barrier was released with). A clock maps slots to epochs: a slot is an
actor's name, or a slot a finished DMA left for a later one to reuse; the epoch is how
many steps the slot's owner had made. An access is stamped with an epoch, its slot's
value at the time; it happened before a clock that has reached that value in that slot.

`Released`: what DMAs started by one core released to a sync object, kept so that the
core's own wait joins only their epochs (issue 55.4).

Slots a clock has never heard of read as 0, so clocks hold only the slots they know of
(a few cores and the DMAs in flight), not one entry per actor of the call.
"""

from __future__ import annotations


class VectorClock(dict[str, int]):
    """Epochs per slot, `clock.get(slot, 0)` (a slot not held is 0; `clock[slot]` only
    for a slot it holds, such as its owner's own), changed in place by `tick` and `join`
    and by nothing else: setting an epoch directly could move a clock backwards and order
    accesses that are not ordered.

    Why a dict underneath, not a class holding one: the race checker reads an epoch for
    every pair of accesses it compares and makes a clock for every DMA it starts, and a
    method call or an extra object there costs several % of a run with races on
    (benchmarks/README.md). So reading an epoch is a dict lookup, and the checker's
    innermost loop inlines `has_seen`. (dict's own `copy` and `|` answer plain dicts: use
    `copy` and `forked` below.)
    """

    __slots__ = ()

    @classmethod
    def starting(cls, slot: str) -> VectorClock:
        """A new actor's clock: it knows nothing of others, and is at epoch 1 in its slot
        (so that its first access is not taken as one every clock has seen)."""
        return cls({slot: 1})

    def has_seen(self, slot: str, epoch: int) -> bool:
        """Whether the access stamped (`slot`, `epoch`) happened before this clock."""
        return epoch <= self.get(slot, 0)

    def tick(self, slot: str) -> None:
        """The owner of `slot` takes a step: what it does next is after what it did."""
        self[slot] = self.get(slot, 0) + 1

    def join(self, other: VectorClock) -> None:
        """Learn all `other` knows (pointwise max, in place): an acquire, a wait, a join."""
        get = self.get
        for slot, epoch in other.items():
            if get(slot, 0) < epoch:
                self[slot] = epoch

    def copy(self) -> VectorClock:
        """An independent clock that knows the same (a loop's base for its iterations)."""
        return VectorClock(self)

    def forked(self, slot: str, epoch: int) -> VectorClock:
        """The clock of an actor this clock's owner starts: it knows all this clock knows,
        and is at `epoch` in its own `slot`."""
        clock = VectorClock(self)
        clock[slot] = epoch
        return clock

    def __repr__(self) -> str:
        return f"VectorClock({dict.__repr__(self)})"


class Released:
    """What DMAs started by one core released to a sync object: the clock of the one
    started last (what the core knew then; it knew all the earlier ones' then too), less
    its own slot, and per DMA slot the latest epoch released. Joined, it is exactly the
    join of those DMAs' clocks as released: a DMA's clock is its starter's at its start
    with its own slot set, and changes only in that slot (a DMA waits for nothing).

    `fresh`: the epochs of `epochs` raised since the starter's clock `joined` them last
    (the race checker's `acquire`): a clock only grows, so that clock still has every
    other, and its next wait joins these alone."""

    __slots__ = ("starter", "base", "base_slot", "base_started", "epochs", "fresh", "joined")

    def __init__(self, starter: str) -> None:
        self.starter = starter
        self.base: VectorClock | None = None
        self.base_slot = ""
        self.base_started = -1
        self.epochs: dict[str, int] = {}
        self.fresh: dict[str, int] = {}
        self.joined: VectorClock | None = None

    def add(self, vc: VectorClock, slot: str, epoch: int, started: int) -> None:
        """A DMA's clock `vc`, in `slot` at `epoch`, the `started`-th fork, released."""
        if started > self.base_started:  # (started later: knows all the earlier knew)
            self.base, self.base_slot, self.base_started = vc, slot, started
        if self.epochs.get(slot, 0) < epoch:
            self.epochs[slot] = self.fresh[slot] = epoch

    def join_base(self, into: VectorClock) -> None:
        base, skip, get = self.base, self.base_slot, into.get
        assert base is not None
        for slot, epoch in base.items():
            if slot != skip and get(slot, 0) < epoch:
                into[slot] = epoch

    def clock(self) -> VectorClock:
        """As one clock (another starter's DMA releases the same object)."""
        joined = VectorClock()
        self.join_base(joined)
        for slot, epoch in self.epochs.items():
            if joined.get(slot, 0) < epoch:
                joined[slot] = epoch
        return joined
