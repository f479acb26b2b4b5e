"""What the engine tells the checkers: a small protocol, so the engine imports no checker.

The engine simulates; at each event below it calls the `Checkers` it was given (the session
hands it `pallas_check.checkers.CHECKERS`), and the checkers build the findings. The engine
never decides what is a defect, and never prints.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

import numpy as np

from pallas_check.findings import Finding, IndexRange, KernelInfo, SourceFrame


@dataclasses.dataclass
class UninitRead:
    """A read of never-written elements (collected during a call; whether they reached an
    output is decided after the call, by the checkers)."""

    buffer: str
    memory_space: str
    index_range: IndexRange
    frames: tuple[SourceFrame, ...]
    grid_point: tuple[int, ...] | None
    actor: str
    count: int
    # Why the memory is never written, where the engine knows more than the buffer's
    # name says (an output block a revisit re-fetched as fresh memory).
    note: str = ""


@dataclasses.dataclass
class UnboundedDma:
    """A DMA the call stopped at: a slice size (traced) that no part of its ref can hold,
    so it was never made (nothing allocated with its size). `reads`: how many reads of
    never-written memory came before it (`CallState.uninit_reads[:reads]`), the candidates
    for where its address came from; `ranges`: (source, destination) index ranges."""

    id: int
    frames: tuple[SourceFrame, ...]
    ranges: tuple[IndexRange, IndexRange]
    names: tuple[str, str]
    reads: int
    grid_point: tuple[int, ...] | None
    actor: str


@dataclasses.dataclass(frozen=True)
class KernelPrint:
    """One line a kernel printed (`pl.debug_print`), with who printed it. The engine only
    collects them, in simulated order; the session writes them after the call."""

    device: int
    core: int
    grid_point: tuple[int, ...] | None
    text: str

    def line(self) -> str:
        """`[dev 1 core 0 (2, 0)] text`: which device, core and grid step printed it (on
        each line of a text of several, e.g. a 2-D array)."""
        where = f"dev {self.device} core {self.core}"
        if self.grid_point:  # (a kernel with no grid has one step: nothing to tell)
            where += f" {tuple(self.grid_point)}"
        return "\n".join(f"[{where}] {part}" for part in self.text.split("\n"))


class RaceDetector(Protocol):
    """Happens-before bookkeeping, fed by the engine's accesses and sync edges."""

    def declare(self, actors: Any) -> None: ...

    def access(self, actor: str, buffer: Any, index_range: IndexRange, is_write: bool,
               operation: str, frames: tuple, grid_point: Any,
               atomic_add: bool = False) -> None: ...

    def fork(self, parent: str, child: str) -> None: ...

    def release(self, actor: str, key: Any) -> None: ...

    def acquire(self, actor: str, key: Any) -> None: ...

    def join_finished(self, actor: str, finished: str) -> None: ...

    def end(self, actor: str) -> None: ...


class Checkers(Protocol):
    """The events of one simulated call, answered with findings (state: the call's
    CallState, engine/call/state.py; ctx: its CoreContext; op: an Operand, call/describe.py)."""

    def masked_out_of_bounds(self, region: Any, mask: np.ndarray) -> bool:
        """Whether an access's mask lets any out-of-bounds element through."""

    def access_out_of_bounds(self, state: Any, ctx: Any, region: Any, operation: str,
                             frames: tuple) -> Finding: ...

    def block_out_of_bounds(self, ctx: Any, op: Any, block_index: tuple,
                            bad_dims: list[int], frames: tuple) -> Finding: ...

    def revisit_lost(self, state: Any, lost: Any) -> Finding:
        """An output block was visited again after other blocks, and what an earlier
        visit did does not reach its final value (engine/call/revisit.py's `Lost`)."""

    def device_out_of_bounds(self, state: Any, ctx: Any, device: str, what: str,
                             frames: tuple) -> Finding:
        """A DMA or signal aimed at a device outside the mesh."""

    def deadlocked(self, state: Any, deadlock: Any, ctx: Any) -> Finding: ...

    def call_ended(self, state: Any, ctx: Any) -> None:
        """The kernel finished (not deadlocked): semaphores left with a count."""

    def dmas_not_waited(self, state: Any) -> list[Finding]: ...

    def output_unwritten(self, state: Any, buffer: Any) -> None: ...

    def outputs_of_two_fills(self, output_names: list[str], state: Any,
                             outputs: list[np.ndarray], other_outputs: list[np.ndarray],
                             written: list[np.ndarray | None], kernel: KernelInfo,
                             call_index: int) -> list[Finding]:
        """The call re-run with the other fill: which outputs never-written memory reached."""

    def dma_address_of_two_fills(self, state: Any,
                                 other: tuple[IndexRange, IndexRange] | None) -> list[Finding]:
        """The call re-run with the other fill up to the DMA it stopped at
        (`state.unbounded_dma`): `other` is that DMA's ranges there (None: not reached);
        different ones mean its address came from never-written memory."""

    def check_failed(self, state: Any, ctx: Any, message: str, check: str,
                     frames: tuple) -> Finding:
        """The kernel's own assertion (`pl.debug_check`) is false at this step: `message`
        with its values formatted, `check` the unformatted one (the same check seen again
        at another step is merged with this one)."""

    def race_detector(self, make_finding: Callable[..., Finding],
                      add: Callable[[Finding], None]) -> RaceDetector: ...

    def not_lowered(self, kernel: KernelInfo, call_index: int, error: Any) -> Finding:
        """The kernel does something Mosaic does not lower (engine/jaxpr/mosaic_limits.py's
        NotLowered): the call was skipped."""


_default: Checkers | None = None


def set_default_checkers(checkers: Checkers) -> None:
    """What a call is checked by when its caller names no Checkers (pallas_check.checkers
    registers itself here when imported)."""
    global _default
    _default = checkers


def default_checkers() -> Checkers:
    if _default is None:
        raise RuntimeError("no checkers: import pallas_check.checkers (or pass checkers=)")
    return _default
