"""The seam between the rules and the call: what a rule may see and do on the running call
(`RunningCall`) and on the core running kernel code (`RunningCore`).

Rules may not import engine/call/ (a call drives rules, never the reverse: pyproject.toml's
layers), so they reach the call through these protocols, which engine/call/state.py's
`CallState` and `CoreContext` satisfy structurally (state.py states it once, so that mypy
checks it). A protocol costs nothing at run time: the rules read the call's own attributes.
Read-only members are properties here; a member a rule assigns is an attribute.

The lower wings name only what they use: engine/jaxpr/evaluating.py's `Evaluating` (the
evaluator's) and engine/dma/engine.py's `DmaCore` and `DmaCall` (a DMA's); these extend
them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

import numpy as np

from pallas_check.config import TpuGeneration
from pallas_check.jaxbridge.types import AbstractValue
from pallas_check.engine.dma.engine import Dma, DmaCall, DmaCore, SemCell
from pallas_check.engine.dma.policy import DmaPolicy
from pallas_check.engine.events import Access, Event, Feeds
from pallas_check.engine.memory.access_cache import AccessCache
from pallas_check.engine.memory.buffer import Buffer, RefView
from pallas_check.engine.memory.region import Region
from pallas_check.engine.runtime.barrier import SubcoreBarrier
from pallas_check.findings.finding import IndexRange, SourceFrame

# A DMA's id -> its (source, destination) ranges, or None until the DMA is reached: the
# DMAs whose ranges a re-run with the other fill records (engine/call/explore.py).
AddressProbe = dict[int, "tuple[IndexRange, IndexRange] | None"]


class RunningCall(DmaCall, Protocol):
    """The running call as a rule sees it: where its moments go (each becomes a typed event
    for the call's listeners), its DMA state and mode, its buffers by place."""

    # Whether a core drew bits from its hardware PRNG (engine/rules/random.py): bits
    # that are ours, not the chip's (`diff` and `replay` do not compare such a call's values).
    drew_random: bool

    @property
    def feeds(self) -> Feeds: ...

    @property
    def races(self) -> tuple[Callable[[Access], None], ...] | None:
        """The listeners fed accesses; None when none is (a rule then skips resolving
        what an access touched)."""

    @property
    def accesses(self) -> AccessCache: ...

    @property
    def report(self) -> bool:
        """Whether this run reports (the second-fill and revisit re-runs do not)."""

    @property
    def core_mesh(self) -> object | None:
        """The call's core mesh (a core_map / pl.kernel call's `mesh`), None for a grid."""

    @property
    def address_probe(self) -> AddressProbe | None: ...

    @property
    def dma_policy(self) -> DmaPolicy: ...

    @property
    def tpu(self) -> TpuGeneration:
        """The generation the call is simulated as (what a DMA adds to a regular
        semaphore differs: engine/dma/counts.py)."""

    @property
    def subcore_barriers(self) -> dict[tuple[int, int], SubcoreBarrier]: ...

    @property
    def contexts(self) -> Sequence[RunningCore]:
        """Every core of the call (a SparseCore barrier's members)."""

    # A core event, or a NamedTuple an engine module registered with `@event_kind`.
    def tell(self, event: Event | tuple[object, ...]) -> None: ...

    def access(self, ctx: RunningCore, region: Region, is_write: bool, operation: str,
               actor: str | None = None, frames: tuple[SourceFrame, ...] | None = None,
               atomic_add: bool = False) -> None: ...

    def access_box(self, ctx: RunningCore, buffer: Buffer, box: IndexRange, is_write: bool,
                   operation: str, frames: tuple[SourceFrame, ...]) -> None: ...

    def left_out_one(self) -> None: ...

    # Accesses of `unraced` buffers left out so far (engine/call/access_feed.py).
    left_out: int

    def on_write(self, ctx: RunningCore, region: Region) -> None: ...

    def out_of_bounds(self, ctx: RunningCore, region: Region, operation: str,
                      mask: np.ndarray | None) -> None: ...

    def uninitialized_read(self, ctx: RunningCore, region: Region, count: int,
                           unwritten: np.ndarray | None = None) -> None: ...

    def undefined_lanes(self, ctx: RunningCore, what: str, count: int, note: str,
                        region: Region | None = None) -> None: ...

    def dma_unbounded(self, ctx: RunningCore, dma_id: int, src: Region, dst: Region,
                      frames: tuple[SourceFrame, ...]) -> None: ...

    def check_failed(self, ctx: RunningCore, message: str, check: str) -> None: ...

    def kernel_print(self, ctx: RunningCore, text: str) -> None: ...

    def on_dma_start(self, ctx: DmaCore, dma: Dma, carried: bool = False) -> None: ...

    def on_dma_wait(self, ctx: RunningCore, cell: SemCell,
                    frames: tuple[SourceFrame, ...]) -> None: ...

    def on_semaphore_wait(self, ctx: RunningCore, cell: SemCell) -> None: ...

    def on_signal(self, ctx: RunningCore, cell: SemCell) -> None: ...

    def on_subcore_barrier(self, ctx: RunningCore, sparsecore: int, generation: int,
                           passed: bool) -> None: ...

    # An aval is JAX's abstract value of a `pl.run_scoped` allocation (any ref type).
    def allocate_scoped(self, ctx: RunningCore, aval: AbstractValue, name: str,
                        site: tuple[int, int]) -> RefView: ...

    def release_scoped(self, ctx: RunningCore, refs: list[RefView]) -> None: ...

    def barrier_semaphore(self, ctx: RunningCore) -> RefView: ...


@dataclasses.dataclass
class LoopInProgress:
    """A SparseCore parallel_loop in progress on a core: the actor that runs it (its
    iterations are actors of their own) and how many iterations have started."""

    actor: str
    iterations: int = 0


@dataclasses.dataclass
class StagedRhs:
    """An RHS in an MXU's staging register, as it will multiply (transposed already when
    pushed so), and the frames and grid point of the `pltpu.matmul_push_rhs` that pushed
    it."""

    value: np.ndarray
    frames: tuple[SourceFrame, ...]
    grid_point: tuple[int, ...] | None


@dataclasses.dataclass
class Mxu:
    """One MXU of a core as the kernel's explicit MXU operations leave it (their rules:
    engine/rules/mxu.py): its staging registers, the RHS loaded, its float32 accumulator
    (one (8, 128) tile per address), and per address the `matmul_acc_lhs` that last added
    to it since it was last popped (an index into `sources`; -1: nothing held)."""

    accumulator: np.ndarray
    held: np.ndarray
    staged: dict[int, StagedRhs] = dataclasses.field(default_factory=dict)
    rhs: np.ndarray | None = None
    sources: list[tuple[SourceFrame, ...]] = dataclasses.field(default_factory=list)


class RunningCore(DmaCore, Protocol):
    """The core running kernel code as a rule sees it: who it is (its actor name, which a
    SparseCore parallel_loop renames per iteration), where it is in the grid and the meshes,
    its hardware PRNG (which `prng_seed` replaces), its MXUs (by index, made when first
    used) and the call it belongs to."""

    actor: str
    rng: np.random.Generator
    mxus: dict[int, Mxu]

    @property
    def call(self) -> RunningCall: ...

    @property
    def parallel_loops(self) -> list[LoopInProgress]:
        """SparseCore parallel_loops in progress, innermost last."""

    def program_id(self, axis: int) -> int: ...

    def num_programs(self, axis: int) -> int: ...

    def axis_index(self, name: object) -> int: ...
