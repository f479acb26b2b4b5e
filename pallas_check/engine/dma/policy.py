"""DMA modes as strategies: WHEN a DMA's copy happens between its start and its wait.

`--dma eager|on_wait|random` (config `DmaMode`) is one `DmaPolicy` per call, chosen once
(`policy_for`, kept on the call as `CallState.dma_policy`), and the only place that knows
what a mode means. Both kinds of DMA the engine moves are `Transfer`s that it drives:
the kernel's own (`pltpu.async_copy`: engine/dma/engine.py `Dma`, started and waited by
engine/rules/dma.py) and the BlockSpec pipeline's block copies (engine/call/pipeline.py
`BlockCopy`). The engine asks the policy at each of these points:

- `started`: a transfer began (eager: it completes now; random: it becomes a scheduler
  actor of its own; on_wait: nothing yet);
- `land_for`: a wait finds its semaphore short: which transfers in flight that signal it
  happen now, in which order (on_wait: newest first; others: none, the wait blocks);
- `await_transfer`: a wait on one transfer not yet landed (a pipeline copy): complete it
  now, or the scheduler `Wait` to yield until it lands (random);
- `arrived`: a DMA carried in from an earlier call: the actor that runs it, if any;
- `drain`: the kernel's end: what is still in flight completes;
- `actors`: whether transfers are scheduler actors (so each needs a name).

A new mode: its `DmaMode` value (config/model.py) and a subclass here that names it.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterable

from pallas_check.config import DmaMode
from pallas_check.engine.dma.engine import (DmaCore, SemCell, SyncState, Transfer, complete,
                                            dma_read, sem_value)
from pallas_check.engine.runtime.scheduler import Actor, Wait
from pallas_check.findings.finding import SourceFrame


class DmaPolicy:
    """When the transfers of one call move their data (see the module docstring). The
    base class is the mode that does nothing on its own: a transfer lands only when a
    wait needs it to (and then completes), or at the kernel's end."""

    mode: ClassVar[DmaMode]
    # Whether each transfer is a scheduler actor of its own (then each needs a name, and
    # a wait on one that has not landed blocks instead of completing it).
    actors: ClassVar[bool] = False
    _by_mode: ClassVar[dict[DmaMode, "DmaPolicy"]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "mode" in cls.__dict__:
            DmaPolicy._by_mode[cls.mode] = cls()

    def started(self, ctx: DmaCore, transfer: Transfer) -> None:
        """A transfer began (its start's accounting and events are done)."""

    def land_for(self, ctx: DmaCore, sync: SyncState, cell: SemCell, wanted: int) -> None:
        """A wait wants `wanted` on semaphore `cell`, which holds less: make happen now
        what this mode lets happen at a wait (nothing: the wait blocks until other actors
        signal it)."""

    def await_transfer(self, ctx: DmaCore, transfer: Transfer, what: str,
                       frames: tuple[SourceFrame, ...]) -> Wait | None:
        """A wait on `transfer`, which has not landed: it completes now (None), or the
        `Wait` the waiting actor yields until it has (`what`, `frames`: how a deadlock
        report names that wait)."""
        transfer.complete(ctx)
        return None

    def arrived(self, ctx: DmaCore, transfer: Transfer) -> Actor | None:
        """A DMA carried in from an earlier call, not landed: the actor that moves it, or
        None (it lands when a wait needs it, or at the kernel's end)."""
        return None

    def drain(self, ctx: DmaCore, transfers: Iterable[Transfer]) -> None:
        """The kernel's end: every transfer still in flight completes (the DMAs never
        waited are reported by the checkers after this)."""
        for transfer in transfers:
            if not transfer.copied:
                transfer.complete(ctx)


class EagerDmas(DmaPolicy):
    """`--dma eager`: a transfer moves its data when it starts (the copy is never late)."""

    mode = DmaMode.EAGER

    def started(self, ctx: DmaCore, transfer: Transfer) -> None:
        transfer.complete(ctx)


class OnWaitDmas(DmaPolicy):
    """`--dma on_wait`: a transfer moves its data when something waits for it: a wait on
    a semaphore lands the DMAs in flight that signal it, newest first, until it holds
    what the wait wants (DMAs sharing a semaphore may land in any order on a TPU, and
    newest-first is the order that breaks a kernel relying on FIFO)."""

    mode = DmaMode.ON_WAIT

    def land_for(self, ctx: DmaCore, sync: SyncState, cell: SemCell, wanted: int) -> None:
        receiving = sync.landing_only(cell)
        if receiving is not None:  # the common case: only DMAs landing here signal it
            while receiving and sem_value(cell) < wanted:
                dma = receiving.pop()  # newest first; one landed already needs nothing more
                if not dma.copied:
                    complete(ctx, dma)
            return
        for dma, lands in sync.pending_on(cell):  # a send semaphore too: reads count
            if sem_value(cell) >= wanted:
                return
            if lands:
                complete(ctx, dma)
            else:
                dma_read(ctx, dma)


class RandomDmas(DmaPolicy):
    """`--dma random`: each transfer is a scheduler actor; its events (a read, a write)
    happen at points the scheduler picks, after its start and before what waits for it."""

    mode = DmaMode.RANDOM
    actors = True

    def started(self, ctx: DmaCore, transfer: Transfer) -> None:
        ctx.call.scheduler.spawn(Actor(transfer.actor_name, transfer.events(ctx),
                                       transient=True))

    def await_transfer(self, ctx: DmaCore, transfer: Transfer, what: str,
                       frames: tuple[SourceFrame, ...]) -> Wait | None:
        landed: Callable[[], bool] = lambda: transfer.copied
        return Wait(landed, what, frames)

    def arrived(self, ctx: DmaCore, transfer: Transfer) -> Actor | None:
        return Actor(transfer.actor_name, transfer.events(ctx))


def policy_for(mode: DmaMode) -> DmaPolicy:
    """The one policy of a mode (policies hold no state: shared by every call)."""
    return DmaPolicy._by_mode[DmaMode(mode)]
