"""The run-time state of one simulated call (`CallState`: what the rules report to, which
turns each moment into a typed event for the call's listeners, engine/events.py) and of
one core running kernel code (`CoreContext`)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from pallas_check.config import parse_generations
from pallas_check.engine.call.describe import MeshInfo
from pallas_check.engine.call.parts import CallPlace, Handover, Simulation
from pallas_check.engine.call.revisit import RevisitRecord
from pallas_check.engine.dma.engine import Dma, DmaCore, SemCell, SyncState
from pallas_check.engine.call import event_data
from pallas_check.engine.call.buffers import CallBuffers
from pallas_check.engine.call.access_feed import AccessFeed
from pallas_check.engine.events import (
    KIND_OF, Access, AtBarrier, CallFacts, CopyMoved, CopyStarted, CopyWaited, CoreDone, Event,
    Feeds, Found, GridStep, KernelPrint, Listener, Signalled, Waited)
from pallas_check.engine.verdicts import (BlockOutOfBounds, CheckFailed, DeviceOutOfBounds,
                                          OutOfBounds, UnboundedDma, UninitRead, UnlandedDma)
from pallas_check.engine.dma.policy import DmaPolicy, policy_for
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.memory.access_cache import AccessCache
from pallas_check.jaxbridge.types import JaxprEqn
from pallas_check.engine.memory.buffer import Buffer, fill_value
from pallas_check.engine.memory.region import Region, masked_out_of_bounds
from pallas_check.engine.memory.usage import EverWritten
from pallas_check.engine.runtime import progress
from pallas_check.engine.runtime.barrier import SubcoreBarrier
from pallas_check.engine.runtime.scheduler import Scheduler
from pallas_check.engine.seam import AddressProbe, LoopInProgress, Mxu, RunningCore
from pallas_check.engine.timeline import Timeline
from pallas_check.findings.finding import Finding, IndexRange, SourceFrame

_new = tuple.__new__  # (an event from its fields in order, as event_data.py makes them)

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.describe import Operand


def _facts(run: Simulation) -> CallFacts:
    """What the listeners of a simulation know of its call. Races are checked in a run that
    reports only: a re-run that compares outputs (the second fill, a revisit's
    perturbation) keeps no finding, and its race checker doubled the time of a call that
    reads never-written memory (issue 54.7); what a simulation computes does not depend on
    it (no checker steers it)."""
    config = run.config
    return CallFacts(run.kernel, run.call_index, config.seed,
                     bool(config.races) and run.report)


class CallState(CallBuffers, AccessFeed):
    """Everything one simulation of one pallas_call owns; discarded when it ends. Built
    whole from its parts: what the simulation is, where the call runs, what it shares with
    the runs around it; the rest is the state the run itself changes."""

    drew_random = False  # a core drew from its hardware PRNG (set by rules/random.py)

    def __init__(self, run: Simulation, place: CallPlace = CallPlace(),
                 handover: Handover = Handover()) -> None:
        config, kernel, call_index = run.config, run.kernel, run.call_index
        self.config, self.tpu = config, parse_generations(config.tpu)[0]
        self.checking = run.checking  # what makes the listeners of a re-run too
        self.fill_mode = run.fill
        self.kernel = kernel
        self.call_index = call_index
        self.report = run.report
        self.findings: list[Finding] = []
        self.uninit_reads: list[UninitRead] = []
        self._unlanded: list[tuple[int, Dma]] = []  # (read's index, its DMA): run_ended
        # pl.debug_print lines in simulated order (the reporting run's; none if quiet)
        self.prints: list[KernelPrint] = []
        # A DMA the call stopped at because no part of its ref can hold its slice's size
        # (dma/engine.py); and, in the re-run with the other fill, that DMA's id -> its ranges
        # there (None until reached): does its address depend on never-written memory?
        self.unbounded_dma: UnboundedDma | None = None
        self.address_probe: AddressProbe | None = handover.address_probe
        self.sync, self.cells = SyncState(), event_data.Cells()  # (cells: as events name them)
        # When this call's DMAs and pipeline copies move their data (--dma).
        self.dma_policy: DmaPolicy = policy_for(config.dma_mode)
        self.semaphores: list[Buffer] = []
        self.barrier: Buffer | None = None
        self.unfinished = False  # deadlocked, or halted by a finding (CallHalted)
        self.scheduler = Scheduler(seed=config.seed)
        self.registry: dict[tuple[int, int | None, tuple[object, ...]], Buffer] = {}
        self.scoped_avals: dict[tuple[object, ...], tuple[Any, str]] = {}  # key -> (aval, name)
        self.mesh: MeshInfo = place.mesh
        self.carried = handover.carried
        # Semaphores passed between calls (engine/call/carried.py): the inputs whose values
        # carry DMAs (buffer, cell, value), those DMAs once started here, the outputs' XLA
        # buffer addresses (one CPU device), the handles of those returned (by buffer id).
        self.arriving: list[tuple[Buffer, tuple[int, ...], Any]] = []
        self.carried_dmas: list[Dma] = []
        self.carried_landed: list[Dma] = []  # landed before this call, followed here
        self.output_addresses = handover.output_addresses
        self.semaphore_handles: dict[int, np.ndarray] = {}
        self.layout_semaphores = place.semaphores
        self.collective_id = place.collective_id
        # SparseCore: the call's core mesh (params["mesh"] of a core_map / pl.kernel call),
        # every core context (a barrier's members), each SparseCore's subcore barrier.
        self.core_mesh = place.core_mesh
        self.contexts: list[CoreContext] = []
        self.subcore_barriers: dict[tuple[int, int], SubcoreBarrier] = {}
        self._fill_cache: dict[np.dtype, np.ndarray] = {}
        # The regions `ref[indices]` accesses resolve to (AccessCache).
        self.accesses = AccessCache()
        self.cores_per_device, self.serial_cores = place.cores_per_device, place.serial_cores
        self._copies_in_flight: set[str] = set()
        # Output blocks revisited after other blocks (engine/call/revisit.py): what each core's
        # pipeline recorded, the VMEM blocks a revisit re-fetched as fresh memory (buffer
        # id -> why, for a read of them), and the perturbation of a re-run deciding them.
        self.revisits: list[RevisitRecord] = []
        self.fresh_revisits: dict[int, str] = {}
        self.perturb = handover.perturb
        self.first_output = place.first_output  # where the outputs start among the parameters
        # Grid steps walked, read by a progress line (engine/runtime/progress.py).
        self.steps = progress.grid_steps(call_index, kernel.name)
        self.steps.start(place.grid_steps * place.mesh.num_devices)
        # The listeners of this call (the checkers', and with --trace and a run that
        # reports, a timeline of this schedule: engine/timeline.py, its marks handed to
        # `sink` as they happen), and per event kind those that take it: where none
        # does, the event is never built.
        self.timeline: Timeline | None = (
            Timeline(kernel.name, call_index, config.seed, run.sink, config.trace_limit)
            if config.timeline and run.report else None)
        self.scheduler.observer = self.timeline  # timeline: steps and blocked spans
        # What was written before a reset made it undefined again, for the note of memory
        # never touched (engine/memory/usage.py); the reporting run only.
        self.ever_written: EverWritten | None = EverWritten() if run.report else None
        # (their sink, a weak proxy: held, the call would be a reference cycle to collect)
        listeners: tuple[Listener, ...] = run.checking.listeners(_facts(run),
                                                                 weakref.proxy(self))
        if self.timeline is not None:  # first: it sees each moment before its findings
            listeners = (self.timeline, *listeners)
        self.feeds = Feeds(listeners)
        self.start_access_feed(listeners)

    def halted(self) -> None:
        """The kernel never finished: deadlocked, or halted by a finding (CallHalted)."""
        self.unfinished = True

    def fill(self, dtype: np.dtype) -> np.ndarray:
        value = self._fill_cache.get(dtype)
        if value is None:
            value = fill_value(dtype, self.fill_mode)
            self._fill_cache[dtype] = value
        return value

    def pipeline_copy_name(self, ctx: "CoreContext", operand: str, writes_back: bool,
                           block: tuple[int, ...]) -> str:
        """A BlockSpec pipeline copy as an actor: `pipeline copy-in of x_ref block (3, 0)`,
        with its core where there are several. The name is unique among the copies in
        flight (`on_copy_waited` frees it), which is all the race checker needs."""
        name = (f"pipeline {'write-back' if writes_back else 'copy-in'} of {operand}"
                f" block {block}")
        if ctx.num_devices > 1 or self.cores_per_device > 1:
            name += f" on {ctx.actor}"
        base, again = name, 1
        while name in self._copies_in_flight:
            again += 1
            name = f"{base} (#{again})"
        self._copies_in_flight.add(name)
        return name

    # -- the finding sink ---------------------------------------------------------------
    def emit(self, finding: Finding) -> None:
        """The call's one finding sink (events.FindingSink): kept by the run that reports."""
        if self.report:
            self.findings.append(finding)
            for take in self.feeds.found:  # timeline: the finding's instant
                take(Found(finding))


    def run_ended(self) -> None:
        """The schedule is over: what is decided after it (the second fill, revisits) is
        no moment of this schedule's timeline, whose open spans end here. Each read that
        came before a DMA into its memory landed now names that DMA's wait, if one came
        later."""
        self.feeds.without("found")
        self.tell_left_out()
        if self.timeline is not None:
            self.timeline.finish()
        for i, dma in self._unlanded:
            read = self.uninit_reads[i]
            if dma.waited_at and read.dma is not None:
                self.uninit_reads[i] = read._replace(dma=read.dma._replace(wait=dma.waited_at))
        self._unlanded.clear()

    # -- the engine's moments, as events (accesses: access_feed.py) ---------------------
    def out_of_bounds(self, ctx: RunningCore, region: Region, operation: str,
                      mask: np.ndarray | None) -> None:
        if mask is not None and not masked_out_of_bounds(region, mask):
            return
        buf = region.buffer
        event = OutOfBounds(event_data.where(ctx, current_frames(ctx)), operation, buf.name,
                            buf.space, tuple(buf.shape), region.index_range(),
                            tuple((o.index, o.dim, o.size) for o in region.oob))
        for take in self.feeds.out_of_bounds:
            take(event)

    def block_out_of_bounds(self, ctx: "CoreContext", op: Operand,
                            block_index: tuple[int, ...], bad_dims: Sequence[int],
                            frames: tuple[SourceFrame, ...], point: tuple[int, ...],
                            prefetched_at: tuple[int, ...] | None = None) -> None:
        """A BlockSpec index map selects a block outside its operand's array: the index
        map of grid point `point`, fetched ahead during `prefetched_at` (None: at its
        own step)."""
        rng = tuple((start, start + size) for start, size in op.block_window(block_index))
        where = event_data.where(ctx, frames)._replace(grid_point=point)
        event = BlockOutOfBounds(where, op.name, op.describe(block_index),
                                 tuple(block_index), rng, tuple(op.hbm.shape),
                                 tuple(bad_dims), op.is_output, prefetched_at)
        for take in self.feeds.block_out_of_bounds:
            take(event)

    def device_out_of_bounds(self, ctx: DmaCore, device: str, what: str,
                             frames: tuple[SourceFrame, ...]) -> None:
        """A DMA or signal aimed at a device outside the mesh."""
        event = DeviceOutOfBounds(event_data.where(ctx, frames), device, what,
                                  tuple(self.mesh.axes))
        for take in self.feeds.device_out_of_bounds:
            take(event)

    def uninitialized_read(self, ctx: RunningCore, region: Region, count: int,
                           unwritten: np.ndarray | None = None) -> None:
        """A read touched never-written elements (`unwritten`: which, in the access's shape);
        the recorded range is theirs, not the whole access's."""
        frames = current_frames(ctx)
        rng = region.index_range() if unwritten is None else region.selected_range(unwritten)
        note = self.fresh_revisits.get(region.buffer.id, "") if self.fresh_revisits else ""
        dma = self.sync.landing_into(region.buffer.id, rng)
        if dma is not None:  # read before the DMA filling it landed: its wait comes later
            self._unlanded.append((len(self.uninit_reads), dma))
        self.uninit_reads.append(UninitRead(
            region.buffer.name, region.buffer.space, rng, frames, ctx.grid_point, ctx.actor,
            count, note, None if dma is None else UnlandedDma(dma.id, dma.frames)))

    def undefined_lanes(self, ctx: RunningCore, what: str, count: int, note: str,
                        region: Region | None = None) -> None:
        """A SparseCore vector op left `count` values undefined: the masked-off lanes of a
        masked gather or expanded load (`what` names them: no memory holds them), or an
        element of `region` that several scatter lanes store different values to. They
        hold the fill value, and the call's outputs are compared under the two fills as
        for a read of never-written memory (`note` says which op left them, why)."""
        name, space, rng = (what, "", None) if region is None else (
            region.buffer.name, region.buffer.space, region.index_range())
        self.uninit_reads.append(UninitRead(name, space, rng, current_frames(ctx),
                                            ctx.grid_point, ctx.actor, count, note))

    def dma_unbounded(self, ctx: RunningCore, dma_id: int, src: Region, dst: Region,
                      frames: tuple[SourceFrame, ...]) -> None:
        """A DMA whose slice no part of its ref can hold (its out-of-bounds findings are
        made): the call stops there; remembered for the re-run with the other fill."""
        ranges = (src.index_range(), dst.index_range())
        if self.address_probe is not None and dma_id in self.address_probe:
            self.address_probe[dma_id] = ranges
        self.unbounded_dma = UnboundedDma(dma_id, frames, ranges,
                                          (src.buffer.name, dst.buffer.name),
                                          len(self.uninit_reads), ctx.grid_point, ctx.actor)

    def check_failed(self, ctx: RunningCore, message: str, check: str) -> None:
        """The kernel's own `pl.debug_check` is false here (engine/rules/debug.py)."""
        if self.report:
            event = CheckFailed(event_data.where(ctx, current_frames(ctx)), message, check)
            for take in self.feeds.check_failed:
                take(event)

    def kernel_print(self, ctx: RunningCore, text: str) -> None:
        """The kernel printed `text` (`pl.debug_print`); the session writes it, prefixed
        with who printed it."""
        if self.report and not self.config.quiet_prints:
            self.prints.append(KernelPrint(ctx.device_id, ctx.core_id, ctx.grid_point, text))

    def dma_copied_unwritten(self, dma: Dma, unwritten: np.ndarray) -> None:
        """A DMA read never-written elements (`unwritten`, in the access's shape) and wrote
        them to HBM: a read of uninitialized memory at the DMA's line."""
        src = dma.src
        rng = src.selected_range(unwritten) if unwritten.ndim else src.index_range()
        note = self.fresh_revisits.get(src.buffer.id, "") if self.fresh_revisits else ""
        self.uninit_reads.append(UninitRead(
            src.buffer.name, src.buffer.space, rng, dma.frames, dma.grid_point,
            dma.actor_name, int(np.count_nonzero(unwritten)) or int(np.prod(src.out_shape)),
            note))

    def on_grid_step(self, ctx: "CoreContext", point: tuple[int, ...]) -> None:
        """A core begins a grid step."""
        if self.feeds.grid_step:
            event = GridStep(ctx.actor, ctx.device_id, ctx.core_id, point)
            for take in self.feeds.grid_step:
                take(event)

    def on_core_done(self, ctx: "CoreContext") -> None:
        """A core finished its grid steps: it accesses nothing more."""
        if self.feeds.core_done:
            event = CoreDone(ctx.actor, ctx.device_id, ctx.core_id)
            for take in self.feeds.core_done:
                take(event)

    # Pipeline block copies (engine/call/pipeline.py; why events of their own: CopyStarted).
    def on_copy_start(self, ctx: "CoreContext", name: str, operand: str, buffer: int) -> None:
        """A BlockSpec pipeline copy began: an actor of its own, forked by the core, as a
        DMA is (`operand`'s VMEM buffer `buffer` it fills or drains, for the timeline)."""
        if self.feeds.copy_started:
            event = _new(CopyStarted, (ctx.actor, ctx.device_id, ctx.core_id, name, operand,
                                       buffer))
            for take in self.feeds.copy_started:
                take(event)

    def on_copy_moved(self, name: str, hbm: Buffer, hbm_range: IndexRange | None,
                      writes_back: bool, frames: tuple[SourceFrame, ...],
                      grid_point: tuple[int, ...] | None) -> None:
        """The copy read its HBM block (copy-in) or wrote it (write-back), and ended;
        `hbm_range` None: an empty block, nothing touched."""
        if self.feeds.copy_moved:
            access = None if hbm_range is None or self._copy_left_out(hbm) else Access(
                name, hbm.id, hbm.name, hbm.space, hbm_range, writes_back,
                "DMA write" if writes_back else "DMA read", frames, grid_point)
            event = _new(CopyMoved, (name, access))
            for take in self.feeds.copy_moved:
                take(event)

    def _copy_left_out(self, hbm: Buffer) -> bool:
        if hbm.unraced:  # nothing writes it in this call (unraced.py): counted, left out
            self.left_out_one()
        return hbm.unraced

    def on_copy_waited(self, ctx: "CoreContext", name: str) -> None:
        """The core waited for the copy: what the copy did happened before what the core
        does next, and its name may serve a later copy."""
        if self.feeds.copy_waited:
            event = _new(CopyWaited, (ctx.actor, name))
            for take in self.feeds.copy_waited:
                take(event)
        self._copies_in_flight.discard(name)

    def on_dma_start(self, ctx: DmaCore, dma: Dma, carried: bool = False) -> None:
        if self.feeds.dma_started:
            event = event_data.dma_started(ctx, dma, carried, self.cells)
            for take in self.feeds.dma_started:
                take(event)

    def on_dma_read(self, ctx: DmaCore, dma: Dma) -> None:
        """The DMA (its own actor) read its source and signals its send semaphore."""
        if self.feeds.dma_moved:
            unraced = self.left_out_of(dma.src)
            if unraced and dma.src_sem is None and self.quiet_reads:
                return  # (no access, no semaphore: no listener takes it)
            event = event_data.dma_moved(dma, False, self.cells, unraced)
            for take in self.feeds.dma_moved:
                take(event)

    def on_dma_write(self, ctx: DmaCore, dma: Dma) -> None:
        """The DMA wrote its destination and signals its receive semaphore; it ends."""
        if self.feeds.dma_moved:
            event = event_data.dma_moved(dma, True, self.cells)
            for take in self.feeds.dma_moved:
                take(event)

    def on_dma_wait(self, ctx: RunningCore, cell: SemCell,
                    frames: tuple[SourceFrame, ...]) -> None:
        self._waited(ctx, cell, "DMA wait")

    def on_semaphore_wait(self, ctx: RunningCore, cell: SemCell) -> None:
        self._waited(ctx, cell, "semaphore wait")

    def _waited(self, ctx: RunningCore, cell: SemCell, what: str) -> None:
        if self.feeds.waited:
            event = _new(Waited, (ctx.actor, ctx.device_id, ctx.core_id, self.cells(cell), what,
                                  event_data.owed(self.sync, cell) if self.owed_taken else ()))
            for take in self.feeds.waited:
                take(event)

    def on_signal(self, ctx: RunningCore, cell: SemCell) -> None:
        if self.feeds.signalled:
            event = Signalled(ctx.actor, ctx.device_id, ctx.core_id, self.cells(cell))
            for take in self.feeds.signalled:
                take(event)

    def dmas_not_waited(self) -> None:
        """At kernel end: each DMA whose bytes were never all waited, as an event."""
        if self.feeds.dma_not_waited:
            for event in event_data.dmas_not_waited(self.sync):
                self.tell(event)

    def tell(self, event: Event | tuple[object, ...]) -> None:
        """A moment built where it happens (the call's start and end, what is decided
        after it): to the listeners of its kind."""
        for take in getattr(self.feeds, KIND_OF[type(event)]):
            take(event)

    def on_subcore_barrier(self, ctx: RunningCore, sparsecore: int, generation: int,
                           passed: bool) -> None:
        """A subcore arrived at its SparseCore's barrier (`passed` False), or went through
        it (True): happens-before edges for the race checker (only it listens)."""
        if self.feeds.subcore_barrier:
            event = AtBarrier(ctx.actor, ctx.device_id, sparsecore, generation, passed)
            for take in self.feeds.subcore_barrier:
                take(event)


class CoreContext:
    """What the rules see of the actor running kernel code: one core of one device."""

    def __init__(self, call: CallState, grid: tuple[int, ...], program_axes: list[int],
                 device_id: int = 0, core_id: int = 0, num_devices: int = 1,
                 local_name: str | None = None) -> None:
        self.call = call
        self.config = call.config
        self.grid = grid
        self.program_axes = program_axes
        self.device_id = device_id
        self.core_id = core_id
        self.num_devices = num_devices
        # Its name on its device (`core 0`; a SparseCore subcore: `sparsecore 1 subcore 7`):
        # the timeline's track; the actor's name adds the device when there are several.
        self.local_name = local_name or f"core {core_id}"
        self.actor = (f"device {device_id} {self.local_name}" if num_devices > 1
                      else self.local_name)
        self.grid_point: tuple[int, ...] | None = None
        self.eqn: JaxprEqn | None = None
        # The core's hardware PRNG (pltpu.prng_seed / prng_random_bits), deterministic.
        self.rng: np.random.Generator = np.random.default_rng([device_id, core_id])
        # Its MXUs as explicit MXU operations leave them (rules/mxu.py), made when first used.
        self.mxus: dict[int, Mxu] = {}
        self.mesh = call.mesh
        self.core_coords: dict[str, int] = {}  # this core's place in a TensorCore mesh
        self.private_buffers: list[Buffer] = []  # its VMEM/SMEM blocks and scratch
        # Source frames of the enclosing equations being evaluated (see current_frames).
        self.frame_stack: list[tuple[SourceFrame, ...]] = []
        # SparseCore parallel_loops in progress, innermost last (rules/sparsecore.py).
        self.parallel_loops: list[LoopInProgress] = []
        call.contexts.append(self)

    def fill(self, dtype: np.dtype) -> np.ndarray:
        return self.call.fill(dtype)

    def program_id(self, axis: int) -> int:
        assert self.grid_point is not None
        return int(self.grid_point[self.program_axes[axis]])

    def num_programs(self, axis: int) -> int:
        return int(self.grid[self.program_axes[axis]])

    def core_mesh_sizes(self) -> dict[str, int]:
        if not self.core_coords:
            return {}
        names = list(self.core_coords)
        return dict(zip(names, self.grid[-len(names):]))

    def axis_index(self, name: object) -> int:
        """This device's coordinate along a mesh axis (several axes: row-major)."""
        names = name if isinstance(name, (tuple, list)) else (name,)
        coords = {**self.mesh.coords(self.device_id), **self.core_coords}
        sizes = {**dict(self.mesh.axes), **self.core_mesh_sizes()}
        index = 0
        for n in names:
            if n not in coords:
                raise KernelError(f"axis {n!r} is not a mesh axis of this call"
                                  f" (axes: {', '.join(map(str, sizes)) or 'none'})")
            index = index * sizes[n] + coords[n]
        return index


def _seam(ctx: CoreContext) -> RunningCore:
    """The concrete core is what the rules see through engine/seam.py (and so its call a
    RunningCall): stated once, for mypy to check the protocols against these classes."""
    return ctx
