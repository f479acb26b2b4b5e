"""Runs actors (generators that yield where another actor could run) to completion.

An actor yields a `Wait` when it cannot proceed. The scheduler picks the next runnable
actor deterministically from its seed; when every unfinished actor waits on something
that cannot become true, that is a deadlock, reported with who waits on what.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Generator

from pallas_check.engine.sync import Wait


@dataclasses.dataclass
class Actor:
    name: str
    gen: Generator[Any, None, Any]
    waiting: Wait | None = None
    done: bool = False
    result: Any = None


@dataclasses.dataclass
class Deadlock(Exception):
    """No actor can run and some are waiting: what each waits on."""

    blocked: list[tuple[str, Wait]]


class Scheduler:
    """Deterministic choice among runnable actors: the same seed, the same interleaving."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def pick(self, runnable: list[Actor]) -> Actor:
        if len(runnable) == 1:
            return runnable[0]
        return runnable[self._rng.randrange(len(runnable))]

    def run(self, actors: list[Actor]) -> None:
        """Advance actors until all finish; raise Deadlock when none can move."""
        while True:
            live = [a for a in actors if not a.done]
            if not live:
                return
            runnable = [a for a in live if a.waiting is None or a.waiting.ready()]
            if not runnable:
                raise Deadlock([(a.name, a.waiting) for a in live if a.waiting is not None])
            actor = self.pick(runnable)
            actor.waiting = None
            try:
                request = next(actor.gen)
            except StopIteration as stop:
                actor.done = True
                actor.result = stop.value
                continue
            if isinstance(request, Wait):
                actor.waiting = request
