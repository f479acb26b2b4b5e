"""The subcore barrier of one SparseCore (`plsc.subcore_barrier()`).

On the chip the barrier (`tpu.barrier` with id 0) is a counting rendezvous of the vector
subcores of ONE SparseCore: a subcore arriving waits until every subcore of its core has
arrived, then all go on; other SparseCores and other devices are not involved. It knows
no source line: the k-th barrier a subcore reaches meets the k-th of every other subcore,
wherever in the kernel those are. So it is a generation counter: each arrival is counted
in the current generation, the last arrival opens it (the generation advances) and the
waiters of that generation may go on. A subcore that never arrives (it finished, or waits
elsewhere) leaves the others waiting: the scheduler's deadlock, which names it
(checkers/deadlock.py asks `missing`).
"""

from __future__ import annotations

from pallas_check.findings.finding import SourceFrame


class SubcoreBarrier:
    """The barrier of one SparseCore: `members` maps each subcore index to its actor."""

    def __init__(self, where: str, members: dict[int, str]) -> None:
        self.where = where  # "device 0 sparsecore 1": whose barrier it is
        self.members = members
        self.generation = 0
        self.arrived: dict[int, tuple[SourceFrame, ...]] = {}  # this generation's arrivals

    def arrive(self, subcore: int, frames: tuple[SourceFrame, ...]) -> int:
        """`subcore` reaches the barrier: the generation it waits for to open (`opened`);
        the last arrival opens it at once."""
        generation = self.generation
        self.arrived[subcore] = frames
        if len(self.arrived) == len(self.members):
            self.generation += 1
            self.arrived = {}
        return generation

    def opened(self, generation: int) -> bool:
        """Whether every member arrived in `generation` (its waiters may go on)."""
        return self.generation > generation

    def missing(self) -> list[tuple[int, str]]:
        """The subcores (index, actor) that have not arrived in the current generation."""
        return [(s, actor) for s, actor in sorted(self.members.items())
                if s not in self.arrived]

    def waiting(self) -> int:
        return len(self.arrived)
