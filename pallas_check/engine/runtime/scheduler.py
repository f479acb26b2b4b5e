"""Runs actors (generators that yield where another actor could run) to completion.

An actor yields `None` at a scheduling point, or a `Wait` when it cannot proceed. The
scheduler picks the next runnable actor from its seed with PCT-style priorities (each actor
gets a random priority; the highest runnable one runs; at a few random change points the
running actor drops to the lowest priority), which reaches rare orderings far more often
than uniform choice. The same seed always gives the same interleaving. When every
unfinished actor waits on something that cannot become true, that is a deadlock, reported
with who waits on what.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable, Generator, Protocol

from pallas_check.engine.runtime import progress
from pallas_check.engine.runtime.barrier import SubcoreBarrier
from pallas_check.findings.finding import SourceFrame


PRIORITY_CHANGE_POINTS = 3
CHANGE_POINT_HORIZON = 512  # scheduling steps within which the change points fall


@dataclasses.dataclass(frozen=True)
class Wait:
    """A scheduler request: the actor cannot go on until `ready()` holds."""

    ready: Callable[[], bool]
    what: str
    frames: tuple[SourceFrame, ...]
    semaphore: str = ""
    wanted: int = 0
    # What is waited on now: a function giving the semaphore's count, or the barrier.
    current: Callable[[], int] | SubcoreBarrier | None = None
    # The semaphore cell (buffer, index) waited on, for findings to name buffer and index
    # (engine/dma/engine.py's SemCell: the runtime knows no buffer).
    cell: Any = None


@dataclasses.dataclass
class Actor:
    name: str
    gen: Generator[Wait | None, None, object]
    waiting: Wait | None = None
    done: bool = False
    result: object = None
    priority: float = 0.0
    # A DMA's actor (`--dma random`): forgotten once finished, so that a long grid's DMAs
    # cost no memory and no time at each step (a core's stays: a deadlock report asks
    # whether it finished).
    transient: bool = False


@dataclasses.dataclass
class Deadlock(Exception):
    """No actor can run and some are waiting: what each waits on."""

    blocked: list[tuple[str, Wait]]


class Observer(Protocol):
    """Who is told of each scheduling step and each wait that blocks (the timeline)."""

    def scheduled(self, actor: str) -> None: ...

    def blocked(self, actor: str, wait: Wait) -> None: ...


class Scheduler:
    """Deterministic choice among runnable actors: the same seed, the same interleaving."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)
        self.actors: list[Actor] = []
        self.steps = 0
        self._change_points = set(self._rng.sample(range(1, CHANGE_POINT_HORIZON),
                                                   PRIORITY_CHANGE_POINTS))
        self._lowest = 0.0
        # Told each step and each block (engine/timeline.py's Timeline, with --trace).
        self.observer: Observer | None = None
        self.running: Actor | None = None  # the actor last advanced (who raised, if any)

    @property
    def alone(self) -> bool:
        """Whether no other actor exists that could run at a scheduling point (one core,
        DMAs not actors of their own, no timeline counting steps): such a point may be
        skipped, with a heartbeat for the watchdog instead of a trip through the actor's
        generators and this loop."""
        return len(self.actors) == 1 and self.observer is None

    def spawn(self, actor: Actor) -> None:
        """Add an actor (a core at the start, a DMA when it starts in `random` mode)."""
        actor.priority = self._rng.random() + 1.0
        self.actors.append(actor)

    def pick(self, runnable: list[Actor]) -> Actor:
        chosen = max(runnable, key=lambda a: a.priority)
        self.steps += 1
        if self.steps in self._change_points:
            self._lowest -= 1.0
            chosen.priority = self._lowest
        return chosen

    def run(self, actors: list[Actor] | None = None) -> None:
        """Advance actors until all finish; raise Deadlock when none can move."""
        for actor in actors or ():
            self.spawn(actor)
        while True:
            live = [a for a in self.actors if not a.done]
            if not live:
                return
            runnable = [a for a in live if a.waiting is None or a.waiting.ready()]
            if not runnable:
                raise Deadlock([(a.name, a.waiting) for a in live if a.waiting is not None])
            actor = self.pick(runnable)
            if self.observer is not None:  # timeline: one logical step; a wait ends
                self.observer.scheduled(actor.name)
            actor.waiting = None
            self.running = actor
            progress.beat()
            try:
                request = next(actor.gen)
            except StopIteration as stop:
                actor.done = True
                actor.result = stop.value
                if actor.transient:
                    self.actors = [a for a in self.actors if a is not actor]
                continue
            if isinstance(request, Wait):
                actor.waiting = request
                if self.observer is not None:  # timeline: a blocked span begins
                    self.observer.blocked(actor.name, request)
