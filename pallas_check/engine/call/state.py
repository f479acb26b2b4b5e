"""The run-time state of one simulated call (`CallState`, the hub the rules report to and
that forwards events to the checkers) and of one core running kernel code (`CoreContext`)."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from pallas_check.config import Config
from pallas_check.engine.call.describe import MeshInfo, is_semaphore_aval
from pallas_check.engine.dma.engine import Dma, SyncState
from pallas_check.engine.dma.policy import DmaPolicy, policy_for
from pallas_check.engine.events import (Checkers, KernelPrint, RaceDetector, UnboundedDma,
                                        UninitRead)
from pallas_check.engine.jaxpr.errors import KernelError
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.memory.access_cache import AccessCache
from pallas_check.engine.memory.buffer import (Buffer, MemorySpace, RefView, fill_value,
                                               memory_space_name)
from pallas_check.engine.memory.region import Region
from pallas_check.engine.memory.usage import EverWritten
from pallas_check.engine.runtime import progress
from pallas_check.engine.runtime.scheduler import Scheduler
from pallas_check.engine.timeline import Timeline
from pallas_check.findings import Finding, KernelInfo, SourceFrame


class CallState:
    """Everything one simulation of one pallas_call owns; discarded when it ends."""

    def __init__(self, config: Config, fill: str, kernel: KernelInfo, call_index: int,
                 report: bool, checkers: Checkers) -> None:
        self.config = config
        self.checkers = checkers  # what the events of this call go to
        self.fill_mode = fill
        self.kernel = kernel
        self.call_index = call_index
        self.report = report
        self.findings: list[Finding] = []
        self.uninit_reads: list[UninitRead] = []
        # What the kernel printed (pl.debug_print), in simulated order; kept by the run
        # that reports only (not by re-runs), and not at all with --quiet-prints.
        self.prints: list[KernelPrint] = []
        # A DMA the call stopped at because no part of its ref can hold its slice's size
        # (dma/engine.py); and, in the re-run with the other fill, that DMA's id -> its ranges
        # there (None until reached): does its address depend on never-written memory?
        self.unbounded_dma: UnboundedDma | None = None
        self.address_probe: dict[int, Any] | None = None
        self.sync = SyncState()
        # When this call's DMAs and pipeline copies move their data (--dma).
        self.dma_policy: DmaPolicy = policy_for(config.dma_mode)
        self.semaphores: list[Buffer] = []
        self.barrier: Buffer | None = None
        self.unfinished = False  # deadlocked, or halted by a finding (CallHalted)
        self.scheduler: Scheduler | None = None
        self.registry: dict[tuple, Buffer] = {}
        self.scoped_avals: dict[tuple, tuple[Any, str]] = {}  # scoped key -> (aval, name)
        self.mesh: MeshInfo = MeshInfo()
        self.carried: dict = {}
        # Semaphores passed between calls (engine/call/carried.py): the semaphore inputs whose
        # values carry DMAs (buffer, cell, value), those DMAs once started here, the
        # outputs' XLA buffer addresses (one CPU device), the handles of the semaphores
        # returned (by buffer id), and the layout's (semaphore inputs, outputs, aliases,
        # number of inputs).
        self.arriving: list[tuple] = []
        self.carried_dmas: list[Dma] = []
        self.carried_landed: list[Dma] = []  # landed before this call, followed here
        self.output_addresses: list[int] | None = None
        self.semaphore_handles: dict[int, np.ndarray] = {}
        self.layout_semaphores: tuple = (frozenset(), frozenset(), {}, 0)
        self.collective_id: Any = None
        # SparseCore: the call's core mesh (params["mesh"] of a core_map / pl.kernel call),
        # every core context (a barrier's members), each SparseCore's subcore barrier.
        self.core_mesh: Any = None
        self.contexts: list[CoreContext] = []
        self.subcore_barriers: dict[tuple[int, int], Any] = {}
        self.races: RaceDetector | None = None
        if config.races:
            # Weak callbacks: a checker pointing back at the state would make a cycle that
            # keeps the call's buffers alive until some later garbage collection.
            me = weakref.ref(self)
            self.races = checkers.race_detector(lambda **fields: me()._finding(**fields),  # type: ignore[union-attr]
                                     lambda finding: me().add(finding))  # type: ignore[union-attr]
        self._fill_cache: dict[Any, Any] = {}
        # The regions `ref[indices]` accesses resolve to (AccessCache).
        self.accesses = AccessCache()
        self.cores_per_device = 1
        self._copies_in_flight: set[str] = set()
        # Output blocks revisited after other blocks (engine/call/revisit.py): what each core's
        # pipeline recorded, the VMEM blocks a revisit re-fetched as fresh memory (buffer
        # id -> why, for a read of them), and the perturbation of a re-run deciding them.
        self.revisits: list[Any] = []
        self.fresh_revisits: dict[int, str] = {}
        self.perturb: Any = None
        self.first_output = 0  # where the outputs start among the kernel's parameters
        # Grid steps walked so far, read by a progress line (engine/runtime/progress.py); the
        # call's live counter once `_simulate` registers it.
        self.steps = progress.GridSteps(call_index, kernel.name)
        # --trace: a recorder of this schedule's events (an observer; engine/timeline.py).
        self.timeline: Timeline | None = (
            Timeline(kernel.name, call_index, config.seed)
            if config.timeline and report else None)
        # What was written before a reset made it undefined again, for the note of memory
        # never touched (engine/memory/usage.py); the reporting run only.
        self.ever_written: EverWritten | None = EverWritten() if report else None

    def fill(self, dtype: Any) -> Any:
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

    def add(self, finding: Finding) -> None:
        if self.report:
            self.findings.append(finding)
            if self.timeline is not None:  # timeline: the finding's instant
                self.timeline.finding(finding)

    def _finding(self, **fields: Any) -> Finding:
        return Finding(kernel=self.kernel, call_index=self.call_index,
                       seed=self.config.seed, **fields)

    def access(self, ctx: "CoreContext", region: Region, is_write: bool, operation: str,
               actor: str | None = None, frames: tuple[SourceFrame, ...] | None = None,
               atomic_add: bool = False) -> None:
        """Tell the race checker (when on) that an actor touched a region (`atomic_add`:
        an atomic read-modify-write add, which never races with another)."""
        if self.races is None:
            return
        if frames is None:
            frames = current_frames(ctx)
        for box in region.boxes():  # one box unless seen through a reshape / bitcast
            self.races.access(actor or ctx.actor, region.buffer, box, is_write, operation,
                              frames, ctx.grid_point, atomic_add)

    # -- hooks called by the rules ----------------------------------------------------
    def out_of_bounds(self, ctx: "CoreContext", region: Region, operation: str,
                      mask: np.ndarray | None) -> None:
        if mask is not None and not self.checkers.masked_out_of_bounds(region, mask):
            return
        self.add(self.checkers.access_out_of_bounds(self, ctx, region, operation,
                                                    current_frames(ctx)))

    def uninitialized_read(self, ctx: "CoreContext", region: Region, count: int,
                           unwritten: np.ndarray | None = None) -> None:
        """A read touched never-written elements (`unwritten`: which, in the access's shape);
        the recorded range is theirs, not the whole access's."""
        frames = current_frames(ctx)
        rng = region.index_range() if unwritten is None else region.selected_range(unwritten)
        note = self.fresh_revisits.get(region.buffer.id, "") if self.fresh_revisits else ""
        self.uninit_reads.append(UninitRead(
            region.buffer.name, region.buffer.space, rng, frames,
            ctx.grid_point, ctx.actor, count, note))

    def undefined_lanes(self, ctx: "CoreContext", what: str, count: int, note: str,
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

    def dma_unbounded(self, ctx: "CoreContext", dma_id: int, src: Region, dst: Region,
                      frames: tuple[SourceFrame, ...]) -> None:
        """A DMA whose slice no part of its ref can hold (its out-of-bounds findings are
        made): the call stops there; remembered for the re-run with the other fill."""
        ranges = (src.index_range(), dst.index_range())
        if self.address_probe is not None and dma_id in self.address_probe:
            self.address_probe[dma_id] = ranges
        self.unbounded_dma = UnboundedDma(dma_id, frames, ranges,
                                          (src.buffer.name, dst.buffer.name),
                                          len(self.uninit_reads), ctx.grid_point, ctx.actor)

    def check_failed(self, ctx: "CoreContext", message: str, check: str) -> None:
        """The kernel's own `pl.debug_check` is false here (engine/rules/debug.py)."""
        if self.report:
            self.add(self.checkers.check_failed(self, ctx, message, check,
                                                current_frames(ctx)))

    def kernel_print(self, ctx: "CoreContext", text: str) -> None:
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

    def on_write(self, ctx: "CoreContext", region: Region) -> None:
        if self.races is not None:
            self.access(ctx, region, True, "write")

    def on_grid_step(self, ctx: "CoreContext", point: tuple[int, ...]) -> None:
        """A core begins a grid step (only the timeline listens)."""
        if self.timeline is not None:
            self.timeline.grid_step(ctx, point)

    def on_core_done(self, ctx: "CoreContext") -> None:
        """A core finished its grid steps (only the timeline listens)."""
        if self.timeline is not None:
            self.timeline.core_done(ctx)

    def on_copy_start(self, ctx: "CoreContext", name: str, track: str) -> None:
        """A BlockSpec pipeline copy began: an actor of its own, forked by the core, as a
        DMA is (`track`: the VMEM buffer it fills or drains, for the timeline)."""
        if self.timeline is not None:
            self.timeline.copy_started(ctx, name, track)
        if self.races is not None:
            self.races.fork(ctx.actor, name)

    def on_copy_moved(self, name: str, hbm: Buffer, hbm_range: Any, writes_back: bool,
                      frames: tuple, grid_point: Any) -> None:
        """The copy read its HBM block (copy-in) or wrote it (write-back), and ended;
        `hbm_range` None: an empty block, nothing touched."""
        if self.timeline is not None:
            self.timeline.copy_moved(name)
        races = self.races
        if races is None:
            return
        if hbm_range is not None:
            races.access(name, hbm, hbm_range, writes_back,
                         "DMA write" if writes_back else "DMA read", frames, grid_point)
        races.end(name)

    def on_copy_waited(self, ctx: "CoreContext", name: str) -> None:
        """The core waited for the copy: what the copy did happened before what the core
        does next, and its name may serve a later copy."""
        if self.races is not None:
            self.races.join_finished(ctx.actor, name)
        if self.timeline is not None:
            self.timeline.copy_waited(ctx, name)
        self._copies_in_flight.discard(name)

    def on_dma_start(self, ctx: "CoreContext", dma: Dma) -> None:
        if self.timeline is not None:  # timeline: the DMA's track begins
            self.timeline.dma_start(ctx, dma)
        if self.races is not None:
            self.races.fork(ctx.actor, dma.actor_name)

    def on_dma_read(self, ctx: "CoreContext", dma: Dma) -> None:
        """The DMA (its own actor) read its source and signals its send semaphore."""
        if self.timeline is not None:  # timeline: queued -> sending, the send semaphore
            self.timeline.dma_read(dma, [dma.src_sem] if dma.src_sem is not None else [])
        races = self.races
        if races is not None:
            for box in dma.src.boxes():
                races.access(dma.actor_name, dma.src.buffer, box, False, "DMA read",
                             dma.frames, dma.grid_point)
            if dma.src_sem is not None:
                races.release(dma.actor_name, _sync_key(dma.src_sem))

    def on_dma_write(self, ctx: "CoreContext", dma: Dma) -> None:
        """The DMA wrote its destination and signals its receive semaphore."""
        if self.timeline is not None:  # timeline: sending -> landed, the receive semaphore
            self.timeline.dma_landed(dma, [dma.dst_sem])
        races = self.races
        if races is None:
            return
        if dma.atomic_add:  # a SparseCore scatter-add: atomic read-modify-writes
            for box in dma.dst.boxes():
                races.access(dma.actor_name, dma.dst.buffer, box, True, "DMA add",
                             dma.frames, dma.grid_point, atomic_add=True)
        else:
            for box in dma.dst.boxes():
                races.access(dma.actor_name, dma.dst.buffer, box, True, "DMA write",
                             dma.frames, dma.grid_point)
        races.release(dma.actor_name, _sync_key(dma.dst_sem))
        races.end(dma.actor_name)

    def on_dma_wait(self, ctx: "CoreContext", cell: tuple, frames: tuple) -> None:
        if self.timeline is not None:  # timeline: arrows from the signals it consumed
            self.timeline.waited(ctx, cell, "DMA wait")
        if self.races is not None:
            self.races.acquire(ctx.actor, _sync_key(cell))

    def on_signal(self, ctx: "CoreContext", cell: tuple) -> None:
        if self.timeline is not None:  # timeline: a signal instant
            self.timeline.signal(ctx, cell)
        if self.races is not None:
            self.races.release(ctx.actor, _sync_key(cell))

    def on_semaphore_wait(self, ctx: "CoreContext", cell: tuple) -> None:
        if self.timeline is not None:  # timeline: arrows from the signals it consumed
            self.timeline.waited(ctx, cell, "semaphore wait")
        if self.races is not None:
            self.races.acquire(ctx.actor, _sync_key(cell))

    def on_subcore_barrier(self, ctx: "CoreContext", key: tuple, opened: bool) -> None:
        """A subcore arrived at its SparseCore's barrier (`opened` False: what it did so far
        is released to `key`), or went through it (True: what every subcore of its core
        did before arriving happens before what it does next)."""
        if self.races is not None:
            if opened:
                self.races.acquire(ctx.actor, key)
            else:
                self.races.release(ctx.actor, key)

    def allocate(self, aval: Any, name: str, default_space: str = MemorySpace.VMEM,
                 owner: str = "") -> Buffer:
        space = memory_space_name(getattr(aval, "memory_space", None), default_space)
        if is_semaphore_aval(aval) or space == MemorySpace.SEMAPHORE:
            buf = Buffer(name, MemorySpace.SEMAPHORE, np.zeros(aval.shape, np.int64), True,
                         owner=owner)
            self.semaphores.append(buf)
            return buf
        return Buffer.filled(name, space, aval.shape, aval.dtype, self.fill_mode, owner=owner)

    def allocate_scoped(self, ctx: "CoreContext", aval: Any, name: str,
                        site: tuple) -> RefView:
        """A `pl.run_scoped` allocation. The same program allocates in the same order on
        every device and core, so an allocation is at one address for the whole kernel:
        `site` (the run_scoped equation and the position in it) names it everywhere, and
        what another device sent there before this core entered the scope (a semaphore
        count, a DMA's data) is kept."""
        key = ("scoped",) + site
        self.scoped_avals.setdefault(key, (aval, name))
        buf = self.registry.get((ctx.device_id, ctx.core_id, key))
        if buf is None:
            buf = self.register(self.allocate(aval, name, owner=ctx.actor), ctx.device_id,
                                ctx.core_id, key)
        return RefView(buf)

    def release_scoped(self, ctx: "CoreContext", refs: list[RefView]) -> None:
        """The scope ends: its memory holds nothing defined any more (semaphore counts stay,
        as on the chip, and are checked at kernel end)."""
        for ref in refs:
            buf = ref.buffer
            if buf.space != MemorySpace.SEMAPHORE:
                if self.ever_written is not None:
                    self.ever_written.before_reset(buf)
                buf.writable()[...] = self.fill(buf.data.dtype)
                buf.mark_written(Ellipsis, False)

    def register(self, buf: Buffer, device: int, core: int | None, key: tuple) -> Buffer:
        """Name a buffer by its place in the kernel, so that another device's DMA or
        signal aimed at "the same" ref finds this device's copy."""
        buf.key, buf.device, buf.core = key, device, core
        self.registry[(device, core, key)] = buf
        return buf

    def remote(self, buf: Buffer, device: int, frames: tuple = (),
               core: int | None = None) -> Buffer:
        """The buffer on `device` (and `core`, when the id names a core of a TensorCore
        mesh) that corresponds to `buf` (a ref of this core)."""
        target_core = buf.core if core is None or buf.core is None else core
        if device == buf.device and target_core == buf.core:
            return buf
        if not 0 <= device < self.mesh.num_devices:
            raise KernelError(f"device id {device} is outside the mesh of"
                              f" {self.mesh.num_devices} devices", frames)
        other = self.registry.get((device, target_core, buf.key))
        if other is None and buf.key == ("barrier",):
            other = self._barrier(device)
        if other is None and buf.key[:1] == ("scoped",) and buf.key in self.scoped_avals:
            # The other core has not entered the scope yet: its allocation is there all
            # the same (same address), and keeps what lands in it.
            aval, name = self.scoped_avals[buf.key]
            owner = (f"device {device} core {target_core}" if self.mesh.num_devices > 1
                     else f"core {target_core}")
            other = self.register(self.allocate(aval, name, owner=owner), device,
                                  target_core, buf.key)
        if other is None:
            where = f"device {device}" + (f" core {target_core}" if core is not None else "")
            raise KernelError(f"{buf.name} has no counterpart on {where}", frames)
        return other

    def barrier_semaphore(self, ctx: "CoreContext") -> RefView:
        return RefView(self._barrier(ctx.device_id))

    def _barrier(self, device: int) -> Buffer:
        """A device's barrier semaphore; its count carries over to the next call."""
        buf = self.registry.get((device, None, ("barrier",)))
        if buf is None:
            count = self.carried.get(("barrier", self.collective_id, device), 0)
            buf = Buffer("barrier_semaphore", MemorySpace.SEMAPHORE,
                         np.array(count, np.int64), True)
            self.register(buf, device, None, ("barrier",))
            self.semaphores.append(buf)
        return buf

    def save_carried(self) -> None:
        for (device, _, key), buf in self.registry.items():
            if key == ("barrier",):
                self.carried[("barrier", self.collective_id, device)] = int(buf.data)


def _sync_key(cell: tuple) -> tuple:
    buf, idx = cell
    return (buf.id, tuple(int(i) for i in idx))


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
        self.eqn: Any = None
        # The core's hardware PRNG (pltpu.prng_seed / prng_random_bits), deterministic.
        self.rng = np.random.default_rng([device_id, core_id])
        self.mesh = call.mesh
        self.core_coords: dict[str, int] = {}  # this core's place in a TensorCore mesh
        self.private_buffers: list[Buffer] = []  # its VMEM/SMEM blocks and scratch
        # Source frames of the enclosing equations being evaluated (see current_frames).
        self.frame_stack: list[tuple[SourceFrame, ...]] = []
        # SparseCore parallel_loops in progress, innermost last (rules/sparsecore.py).
        self.parallel_loops: list[list[Any]] = []
        call.contexts.append(self)

    def fill(self, dtype: Any) -> Any:
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

    def axis_index(self, name: Any) -> int:
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

