"""One pallas_call on a modelled TPU: buffers, the grid walk, the BlockSpec pipeline.

The grid is walked in the TPU's order (row-major, last axis fastest). Input blocks are
copied into VMEM when their block index changes, output blocks are written back when
theirs is about to change or the grid ends — as the TPU pipeline does — with edge blocks
padded by the uninitialized fill. Findings go to the `CallState`; nothing is printed.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from pallas_check.jaxbridge import jax_core
from pallas_check.jaxbridge import pallas_core
from pallas_check.jaxbridge import state_discharge
from pallas_check.jaxbridge import state_indexing

from pallas_check.config import Config, UninitFill
from pallas_check.engine import memory, rules, sync  # noqa: F401  (rules register themselves)
from pallas_check.engine.evaluate import KernelError, current_frames, eval_jaxpr, structure_key
from pallas_check.engine.memory import Buffer, MemorySpace, RefView, Region
from pallas_check.engine.events import Checkers, RaceDetector, UninitRead, default_checkers
from pallas_check.engine.scheduler import Actor, Deadlock, Scheduler
from pallas_check.findings import Finding, IndexRange, KernelInfo, SourceFrame
from pallas_check.sourceinfo import code_line, parse_src_info


# ---------------------------------------------------------------------------------------
# Static description of a call.


def memory_space_name(space: Any, default: str = MemorySpace.VMEM) -> str:
    if space is None:
        return default
    name = getattr(space, "name", str(space)).upper()
    if name in ("ANY", "HBM", "GLOBAL"):
        return MemorySpace.HBM
    if name in ("SEMAPHORE", "SEMAPHORE_MEM"):
        return MemorySpace.SEMAPHORE
    if name in ("VMEM", "SMEM", "VMEM_SHARED"):
        return name
    return default


def is_semaphore_aval(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    try:
        return dtype is not None and jnp.issubdtype(dtype, pallas_core.semaphore_dtype)
    except TypeError:
        return False


@dataclasses.dataclass
class Operand:
    """An input or output of the call: its HBM array and how blocks map onto it."""

    name: str
    position: int  # index among the kernel's parameters
    is_output: bool
    mapping: Any  # BlockMapping
    hbm: Buffer
    kernel_space: str
    block_sizes: tuple[int, ...]  # one per array dim (squeezed dims are 1)
    squeezed: tuple[bool, ...]
    element: tuple[bool, ...]
    block_indices: np.ndarray | None = None  # (num_steps, ndim)
    vmem: Buffer | None = None

    @property
    def whole_array(self) -> bool:
        return self.vmem is None

    def block_window(self, block_index: Sequence[int]) -> list[tuple[int, int]]:
        """(start, size) per array dim for a block index."""
        return [(int(bi) if elem else int(bi) * size, size)
                for bi, size, elem in zip(block_index, self.block_sizes, self.element)]


def _program_axes(grid_mapping: Any) -> list[int]:
    vmapped = set(grid_mapping.vmapped_dims)
    return [d for d in range(len(grid_mapping.grid)) if d not in vmapped]


_MAX_INDEX_MAP_FNS = 512
_index_map_fns: "collections.OrderedDict[tuple, Callable[..., Any]]" = collections.OrderedDict()
_index_map_lock = threading.Lock()


def _index_map_fn(index_map_jaxpr: jax_core.ClosedJaxpr, num_grid: int, num_scalars: int):
    """All grid points' block indices in one vectorised, compiled call. Cached by the index
    map's structure and constants (an eager call traces its index maps anew every time),
    bounded."""
    key = (structure_key(index_map_jaxpr.jaxpr), _consts_key(index_map_jaxpr.consts),
           num_grid, num_scalars)
    with _index_map_lock:
        fn = _index_map_fns.get(key)
        if fn is not None:
            _index_map_fns.move_to_end(key)
            return fn
    closed = _discharged(index_map_jaxpr)
    n_out = len(index_map_jaxpr.jaxpr.outvars)

    def one(*args):
        return jax_core.jaxpr_as_fun(closed)(*args)[:n_out]

    in_axes = (0,) * num_grid + (None,) * num_scalars
    fn = jax.jit(jax.vmap(one, in_axes=in_axes))
    with _index_map_lock:
        _index_map_fns[key] = fn
        while len(_index_map_fns) > _MAX_INDEX_MAP_FNS:
            _index_map_fns.popitem(last=False)
    return fn


def _consts_key(consts: Sequence[Any]) -> tuple:
    values = [np.asarray(c) for c in consts]
    return tuple((v.shape, v.dtype.str, v.tobytes()) for v in values)


# ---------------------------------------------------------------------------------------
# Per-call state shared by the actors, and per-actor context.


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
        self.sync = sync.SyncState()
        self.semaphores: list[Buffer] = []
        self.barrier: Buffer | None = None
        self.deadlocked = False
        self.scheduler: Scheduler | None = None
        self.registry: dict[tuple, Buffer] = {}
        self.scoped_avals: dict[tuple, tuple[Any, str]] = {}  # scoped key -> (aval, name)
        self.mesh: MeshInfo = MeshInfo()
        self.carried: dict = {}
        self.collective_id: Any = None
        self.races: RaceDetector | None = None
        if config.races:
            # Weak callbacks: a checker pointing back at the state would make a cycle that
            # keeps the call's buffers alive until some later garbage collection.
            me = weakref.ref(self)
            self.races = checkers.race_detector(lambda **fields: me()._finding(**fields),  # type: ignore[union-attr]
                                     lambda finding: me().add(finding))  # type: ignore[union-attr]
        self._fill_cache: dict[Any, Any] = {}

    def fill(self, dtype: Any) -> Any:
        value = self._fill_cache.get(dtype)
        if value is None:
            value = memory.fill_value(dtype, self.fill_mode)
            self._fill_cache[dtype] = value
        return value

    def add(self, finding: Finding) -> None:
        if self.report:
            self.findings.append(finding)

    def _finding(self, **fields: Any) -> Finding:
        return Finding(kernel=self.kernel, call_index=self.call_index,
                       seed=self.config.seed, **fields)

    def access(self, ctx: "CoreContext", region: Region, is_write: bool, operation: str,
               actor: str | None = None, frames: tuple[SourceFrame, ...] | None = None) -> None:
        """Tell the race checker (when on) that an actor touched a region."""
        if self.races is None:
            return
        if frames is None:
            frames = current_frames(ctx)
        self.races.access(actor or ctx.actor, region.buffer, region.index_range(), is_write,
                          operation, frames, ctx.grid_point)

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
        self.uninit_reads.append(UninitRead(
            region.buffer.name, region.buffer.space, rng, frames,
            ctx.grid_point, ctx.actor, count))

    def on_write(self, ctx: "CoreContext", region: Region) -> None:
        if self.races is not None:
            self.access(ctx, region, True, "write")

    def on_dma_start(self, ctx: "CoreContext", dma: sync.Dma) -> None:
        if self.races is not None:
            self.races.fork(ctx.actor, dma.actor_name)

    def on_dma_read(self, ctx: "CoreContext", dma: sync.Dma) -> None:
        """The DMA (its own actor) read its source."""
        if self.races is not None:
            self.races.access(dma.actor_name, dma.src.buffer, dma.src.index_range(), False,
                              "DMA read", dma.frames, dma.grid_point)

    def on_dma_write(self, ctx: "CoreContext", dma: sync.Dma) -> None:
        """The DMA wrote its destination and signals its semaphores."""
        races = self.races
        if races is None:
            return
        races.access(dma.actor_name, dma.dst.buffer, dma.dst.index_range(), True, "DMA write",
                     dma.frames, dma.grid_point)
        races.release(dma.actor_name, _sync_key(dma.dst_sem))
        if dma.src_sem is not None:
            races.release(dma.actor_name, _sync_key(dma.src_sem))
        races.end(dma.actor_name)

    def on_dma_wait(self, ctx: "CoreContext", cell: tuple, frames: tuple) -> None:
        if self.races is not None:
            self.races.acquire(ctx.actor, _sync_key(cell))

    def on_signal(self, ctx: "CoreContext", cell: tuple) -> None:
        if self.races is not None:
            self.races.release(ctx.actor, _sync_key(cell))

    def on_semaphore_wait(self, ctx: "CoreContext", cell: tuple) -> None:
        if self.races is not None:
            self.races.acquire(ctx.actor, _sync_key(cell))

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
                 device_id: int = 0, core_id: int = 0, num_devices: int = 1) -> None:
        self.call = call
        self.config = call.config
        self.grid = grid
        self.program_axes = program_axes
        self.device_id = device_id
        self.core_id = core_id
        self.num_devices = num_devices
        self.actor = f"device {device_id} core {core_id}" if num_devices > 1 else f"core {core_id}"
        self.grid_point: tuple[int, ...] | None = None
        self.eqn: Any = None
        # The core's hardware PRNG (pltpu.prng_seed / prng_random_bits), deterministic.
        self.rng = np.random.default_rng([device_id, core_id])
        self.mesh = call.mesh
        self.core_coords: dict[str, int] = {}  # this core's place in a TensorCore mesh
        # Source frames of the enclosing equations being evaluated (see current_frames).
        self.frame_stack: list[tuple[SourceFrame, ...]] = []

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


# ---------------------------------------------------------------------------------------
# The call.


@dataclasses.dataclass
class CallResult:
    outputs: list[np.ndarray]
    findings: list[Finding]


def kernel_info(params: dict) -> KernelInfo:
    jaxpr = params["jaxpr"]
    info = getattr(jaxpr, "debug_info", None)
    name, file, line = parse_src_info(getattr(info, "func_src_info", None))
    if params.get("name"):
        name = params["name"]
    return KernelInfo(name=name, file=file, line=line)


@dataclasses.dataclass(frozen=True)
class MeshInfo:
    """The named device axes a call runs over (from shard_map), row-major device ids."""

    axes: tuple[tuple[str, int], ...] = ()

    @property
    def num_devices(self) -> int:
        return int(np.prod([size for _, size in self.axes])) if self.axes else 1

    def coords(self, device: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, size in reversed(self.axes):
            out[name] = device % size
            device //= size
        return out

    def logical(self, coords: dict[str, int]) -> int:
        device = 0
        for name, size in self.axes:
            device = device * size + int(coords[name])
        return device


SINGLE_DEVICE = MeshInfo()


@dataclasses.dataclass
class DevicesResult:
    outputs: list[list[np.ndarray]]  # per device, per output
    findings: list[Finding]


def run_call(params: dict, operands: Sequence[np.ndarray], config: Config,
             call_index: int, checkers: Checkers | None = None) -> CallResult:
    """Simulate one pallas_call on one device; return its outputs and findings."""
    result = run_call_devices(params, [operands], config, call_index, checkers=checkers)
    return CallResult(result.outputs[0], result.findings)


def run_call_devices(params: dict, device_operands: Sequence[Sequence[np.ndarray]],
                     config: Config, call_index: int, mesh: MeshInfo = SINGLE_DEVICE,
                     carried: dict | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     results: Sequence[np.ndarray] | None = None,
                     checkers: Checkers | None = None) -> DevicesResult:
    """Simulate one pallas_call on every device of `mesh` together (one operand list per
    device); `carried` holds what outlives a call on a TPU (barrier semaphores).

    `results` (one device): the buffers the call's outputs are returned in; the first
    schedule simulates the outputs' HBM in them, so that the outputs are not copied.

    With `config.schedules` > 1 the call is simulated under seeds seed, seed+1, ...
    until one schedule has findings (or all of them, with keep_going); each finding
    carries the seed that replays it."""
    carried = carried if carried is not None else {}
    checkers = checkers if checkers is not None else default_checkers()
    schedules = max(1, config.schedules)
    findings: list[Finding] = []
    seen: dict[tuple, int] = {}  # merge key -> in how many schedules it appeared
    result: DevicesResult | None = None
    chosen_carried = dict(carried)
    tried = 0
    for i in range(schedules):
        trial_carried = dict(carried)
        trial = _one_schedule(params, device_operands,
                              dataclasses.replace(config, seed=config.seed + i), call_index,
                              mesh, trial_carried, results if i == 0 else None, checkers)
        tried += 1
        if progress is not None:
            progress(i + 1, schedules)
        if result is None or (trial.findings and not findings):
            result, chosen_carried = trial, trial_carried
        # Every occurrence is kept (the store counts them); a defect already seen under an
        # earlier seed is not reported again under a later one.
        keys: set[tuple] = set()
        for finding in trial.findings:
            if finding.seed is None:
                finding.seed = config.seed + i
            key = finding.merge_key()
            if key not in seen:
                findings.append(finding)
            keys.add(key)
        for key in keys:
            seen[key] = seen.get(key, 0) + 1
        if findings and not config.keep_going:
            break
    assert result is not None
    if schedules > 1:
        for finding in findings:
            finding.details["schedules"] = [seen[finding.merge_key()], tried]
    carried.clear()
    carried.update(chosen_carried)
    return DevicesResult(result.outputs, findings)


def _one_schedule(params: dict, device_operands: Sequence[Sequence[np.ndarray]],
                  config: Config, call_index: int, mesh: MeshInfo,
                  carried: dict, results: Sequence[np.ndarray] | None,
                  checkers: Checkers) -> DevicesResult:
    kernel = kernel_info(params)
    main_fill = config.uninit.value
    outputs, state, written = _simulate(params, device_operands, config, main_fill, kernel,
                                        call_index, True, mesh, carried, results, checkers)
    findings = list(state.findings)
    if (state.uninit_reads and config.check_uninit_outputs and not config.skip_floats
            and not state.deadlocked):
        other_fill = "zero" if main_fill == UninitFill.NAN.value else "nan"
        other_outputs, _, _ = _simulate(params, device_operands, config, other_fill, kernel,
                                        call_index, False, mesh, dict(carried or {}), None,
                                        checkers)
        flat = [o for dev in outputs for o in dev]
        flat_other = [o for dev in other_outputs for o in dev]
        flat_written = [w for dev in written for w in dev]
        gm = params["grid_mapping"]
        first_output = gm.num_index_operands + gm.num_inputs
        names = kernel_arg_names(params["jaxpr"])[first_output: first_output + gm.num_outputs]
        flat_names = [name for _ in outputs for name in names]
        findings.extend(state.checkers.outputs_of_two_fills(flat_names, state, flat, flat_other,
                                             flat_written, kernel, call_index))
    return DevicesResult(outputs, findings)


def _simulate(params: dict, device_operands: Sequence[Sequence[np.ndarray]], config: Config,
              fill: str, kernel: KernelInfo, call_index: int, report: bool,
              mesh: MeshInfo = SINGLE_DEVICE, carried: dict | None = None,
              results: Sequence[np.ndarray] | None = None,
              checkers: Checkers | None = None,
              ) -> tuple[list[list[np.ndarray]], CallState, list[list[np.ndarray | None]]]:
    jaxpr: jax_core.Jaxpr = params["jaxpr"]
    gm = params["grid_mapping"]
    state = CallState(config, fill, kernel, call_index, report,
                      checkers if checkers is not None else default_checkers())
    state.mesh = mesh
    state.carried = carried if carried is not None else {}
    state.collective_id = getattr(params.get("compiler_params"), "collective_id", None)
    # The call's operands are: dynamic grid bounds, scalar prefetch, inputs.
    num_bounds = gm.num_dynamic_grid_bounds
    grid = resolve_grid(gm.grid, [np.asarray(b) for b in device_operands[0][:num_bounds]])
    device_operands = [list(ops)[num_bounds:] for ops in device_operands]
    arg_names = kernel_arg_names(jaxpr)
    n_in, n_out = gm.num_inputs, gm.num_outputs
    # input index (counting the scalar-prefetch operands, as pallas_call does) -> output
    aliases = {i - gm.num_index_operands: o
               for i, o in (params.get("input_output_aliases") or ())}
    out_to_in = {o: i for i, o in aliases.items()}

    invars = jaxpr.invars
    block_vars = invars[gm.num_index_operands: gm.num_index_operands + n_in + n_out]
    scratch_vars = invars[gm.num_index_operands + n_in + n_out:]
    points = _grid_points(grid)
    program_axes = _program_axes(gm)
    core_axes = core_mesh_axes(params)
    if core_axes:
        # A core_map / pl.kernel over a TensorCore mesh: every point of the mesh is a core
        # of its own, all running at once with private VMEM.
        core_steps = [np.array([i]) for i in range(len(points))]
    else:
        core_steps = split_grid(points, grid, dimension_semantics(params), config.cores)
    contexts: list[CoreContext] = []
    actors: list[Actor] = []
    device_hbm_outputs: list[list[Buffer]] = []

    for device in range(mesh.num_devices):
        operands = [np.asarray(x) for x in device_operands[device]]
        scalars = operands[: gm.num_index_operands]
        arrays = operands[gm.num_index_operands:]
        # HBM arrays for inputs and outputs, shared by the device's cores.
        hbm_inputs = []
        for i, a in enumerate(arrays[:n_in]):
            # Shared with the operand until written (copy on write): most kernels never
            # write their inputs, and an input may be as large as the device's memory.
            buf = Buffer(arg_names[gm.num_index_operands + i], MemorySpace.HBM,
                         _read_only(a), True)
            hbm_inputs.append(state.register(buf, device, None, ("hbm", i)))
        hbm_outputs: list[Buffer] = []
        for j in range(n_out):
            name = arg_names[gm.num_index_operands + n_in + j]
            if j in out_to_in:
                hbm_outputs.append(hbm_inputs[out_to_in[j]])
            else:
                aval = params["out_avals"][j]
                if (results is not None and mesh.num_devices == 1
                        and results[j].shape == tuple(aval.shape)
                        and results[j].dtype == np.dtype(aval.dtype)):
                    data = results[j]  # the call's own output buffer: filled, simulated in
                    data[...] = memory.fill_value(aval.dtype, fill)
                    buf = Buffer(name, MemorySpace.HBM, data, written=False)
                else:
                    buf = Buffer.filled(name, MemorySpace.HBM, aval.shape, aval.dtype, fill)
                hbm_outputs.append(state.register(buf, device, None, ("hbm", n_in + j)))
        device_hbm_outputs.append(hbm_outputs)

        # Block indices for every grid point, computed in one compiled call per operand.
        templates: list[Operand] = []
        for k, (var, bm) in enumerate(zip(block_vars, gm.block_mappings)):
            is_output = k >= n_in
            hbm = hbm_outputs[k - n_in] if is_output else hbm_inputs[k]
            op = _operand(arg_names[gm.num_index_operands + k], gm.num_index_operands + k,
                          is_output, bm, hbm, var)
            if op.kernel_space != MemorySpace.HBM or not bm.has_trivial_window():
                # An HBM operand with a window (vmap adds a squeezed batch dim) is seen by
                # the kernel as that window of the array, moved at every grid step.
                op.block_indices = _block_indices(bm, points, scalars)
            templates.append(op)

        shared_scratch: dict[int, Buffer] = {}
        for core_id, my_steps in enumerate(core_steps):
            my_points = points[my_steps]
            ctx = CoreContext(state, grid, program_axes, device_id=device, core_id=core_id,
                              num_devices=mesh.num_devices)
            if core_axes:
                ctx.core_coords = dict(zip(core_axes, (int(c) for c in points[core_id])))
            contexts.append(ctx)
            # Each core has its own SMEM copy of the scalar prefetch, its own VMEM blocks
            # and scratch; VMEM_SHARED scratch is one buffer for all cores of a device.
            kernel_args: list[Any] = [
                RefView(state.register(
                    Buffer(arg_names[i], MemorySpace.SMEM, np.array(v), True, owner=ctx.actor),
                    device, core_id, ("smem", i)))
                for i, v in enumerate(scalars)
            ]
            core_operands = []
            for k, template in enumerate(templates):
                op = dataclasses.replace(template)
                if op.block_indices is not None:
                    op.block_indices = op.block_indices[my_steps]
                if op.kernel_space == MemorySpace.HBM:
                    # The whole array, or (under vmap) its window, which _core_body moves
                    # at every grid step: HBM is shared by the cores, never copied to VMEM.
                    kernel_args.append(RefView(op.hbm))
                else:
                    ref_shape = tuple(sz for sz, sq in zip(op.block_sizes, op.squeezed)
                                      if not sq)
                    op.vmem = state.register(
                        Buffer.filled(op.name, op.kernel_space, ref_shape, op.hbm.data.dtype,
                                      fill, owner=ctx.actor),
                        device, core_id, ("block", k))
                    kernel_args.append(RefView(op.vmem))
                core_operands.append(op)
            for position, (var, name) in enumerate(
                    zip(scratch_vars, arg_names[gm.num_index_operands + n_in + n_out:])):
                space = memory_space_name(getattr(var.aval, "memory_space", None))
                if space == MemorySpace.VMEM_SHARED:
                    if position not in shared_scratch:
                        shared_scratch[position] = state.register(
                            state.allocate(var.aval, name), device, None, ("scratch", position))
                    kernel_args.append(RefView(shared_scratch[position]))
                else:
                    buf = state.allocate(var.aval, name, owner=ctx.actor)
                    kernel_args.append(RefView(state.register(buf, device, core_id,
                                                              ("scratch", position))))
            if len(my_points):
                actors.append(Actor(ctx.actor, _core_body(ctx, jaxpr, kernel_args,
                                                          core_operands, my_points)))
    ctx = contexts[0]
    if state.races is not None:
        state.races.declare(actor.name for actor in actors)
    state.scheduler = Scheduler(seed=config.seed)
    try:
        state.scheduler.run(actors)
    except Deadlock as deadlock:
        state.add(state.checkers.deadlocked(state, deadlock, ctx))
        state.deadlocked = True
    # After a deadlock the kernel never finished: leaks and unwritten outputs would be
    # consequences of the hang, not defects of their own.
    _finish_dmas(ctx, report=not state.deadlocked)
    if not state.deadlocked:
        state.checkers.call_ended(state, ctx)
    state.save_carried()
    outputs, written = [], []
    for hbm_outputs in device_hbm_outputs:
        device_written: list[np.ndarray | None] = []
        for j, buf in enumerate(hbm_outputs):
            if j in out_to_in:
                device_written.append(None)
                continue
            device_written.append(buf.shadow)
            if not buf.fully_written and not state.deadlocked:
                state.checkers.output_unwritten(state, buf)
        # The call's buffers die with it: hand their arrays over rather than copy them.
        outputs.append([buf.data for buf in hbm_outputs])
        written.append(device_written)
    return outputs, state, written


def _read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view of an operand, so that the first write copies it (the operands
    are shared by every schedule and fill the call is simulated under)."""
    view = array.view()
    view.flags.writeable = False
    return view


def core_mesh_axes(params: dict) -> tuple[str, ...]:
    """Axis names of a TensorCore mesh the call runs over (core_map / pl.kernel), or ()."""
    mesh = params.get("mesh")
    if mesh is None:
        return ()
    names = getattr(mesh, "axis_names", None) or tuple(getattr(mesh, "shape", {}) or ())
    return tuple(names)


def resolve_grid(grid: Sequence[Any], bounds: Sequence[np.ndarray]) -> tuple[int, ...]:
    """The grid with its dynamic dimensions replaced by the call's bound operands."""
    values = iter(bounds)
    out = []
    for dim in grid:
        if isinstance(dim, tuple):  # a named mesh axis of a core_map kernel: (name, size)
            out.append(int(dim[1]))
        elif dim is pallas_core.dynamic_grid_dim:
            out.append(int(next(values)))
        else:
            out.append(int(dim))
    return tuple(out)


def _operand(name: str, position: int, is_output: bool, bm: Any, hbm: Buffer,
             var: Any) -> Operand:
    space = memory_space_name(getattr(var.aval, "memory_space", None))
    block_sizes, squeezed, element = [], [], []
    for dim in bm.block_shape:
        if isinstance(dim, pallas_core.Squeezed):
            block_sizes.append(1), squeezed.append(True), element.append(False)
        elif isinstance(dim, pallas_core.Blocked):
            block_sizes.append(int(dim.block_size)), squeezed.append(False), element.append(False)
        elif isinstance(dim, pallas_core.Element):
            if dim.padding != (0, 0):
                raise KernelError(f"pl.Element with padding is not supported ({name})")
            block_sizes.append(int(dim.block_size)), squeezed.append(False), element.append(True)
        else:
            raise KernelError(f"block dimension {dim!r} of {name} is not supported")
    return Operand(name, position, is_output, bm, hbm, space, tuple(block_sizes),
                   tuple(squeezed), tuple(element))


def dimension_semantics(params: dict) -> tuple[str, ...]:
    """'parallel' / 'core_parallel' / 'arbitrary' per grid axis (arbitrary when unsaid)."""
    compiler_params = params.get("compiler_params")
    semantics = getattr(compiler_params, "dimension_semantics", None)
    if semantics is None and isinstance(compiler_params, dict):
        semantics = (compiler_params.get("mosaic") or {}).get("dimension_semantics")
    grid = params["grid_mapping"].grid
    if not semantics:
        return ("arbitrary",) * len(grid)
    names = tuple(getattr(x, "name", str(x)).lower() for x in semantics)
    # Under vmap the grid gains leading axes that the semantics do not list.
    return ("arbitrary",) * (len(grid) - len(names)) + names


def split_grid(points: np.ndarray, grid: tuple[int, ...], semantics: tuple[str, ...],
               cores: int) -> list[np.ndarray]:
    """Which grid steps (indices into `points`, in grid order) each core runs: the first
    parallel axis is cut into contiguous chunks, as megacore TPUs split it; without a
    parallel axis core 0 runs the whole grid."""
    everything = np.arange(len(points))
    if cores <= 1:
        return [everything]
    axis = next((d for d, name in enumerate(semantics) if "parallel" in name), None)
    if axis is None:
        return [everything] + [everything[:0] for _ in range(cores - 1)]
    chunk = -(-grid[axis] // cores)
    return [everything[(points[:, axis] >= c * chunk) & (points[:, axis] < (c + 1) * chunk)]
            for c in range(cores)]


def kernel_arg_names(jaxpr: jax_core.Jaxpr) -> list[str]:
    info = getattr(jaxpr, "debug_info", None)
    names = list(getattr(info, "arg_names", None) or ())
    out = []
    for i in range(len(jaxpr.invars)):
        name = names[i] if i < len(names) and names[i] else f"arg{i}"
        out.append(name)
    return out


def _grid_points(grid: tuple[int, ...]) -> np.ndarray:
    if not grid:
        return np.zeros((1, 0), np.int32)
    return np.indices(grid, dtype=np.int32).reshape(len(grid), -1).T.copy()


def _block_indices(bm: Any, points: np.ndarray, scalars: list[np.ndarray]) -> np.ndarray:
    num_grid = points.shape[1]
    fn = _index_map_fn(bm.index_map_jaxpr, num_grid, len(scalars))
    cols = [points[:, d] for d in range(num_grid)]
    if num_grid == 0:
        # vmap needs a mapped axis: evaluate once.
        outs = jax_core.jaxpr_as_fun(
            _discharged(bm.index_map_jaxpr))(*scalars)[: len(bm.index_map_jaxpr.jaxpr.outvars)]
        return np.array([[int(np.asarray(o)) for o in outs]], dtype=np.int64)
    outs = fn(*cols, *scalars)
    return np.stack([np.asarray(o).astype(np.int64).reshape(-1) for o in outs], axis=1)


def _discharged(closed: jax_core.ClosedJaxpr) -> jax_core.ClosedJaxpr:
    """The index map with scalar-prefetch refs turned into plain array arguments."""
    if not any(hasattr(v.aval, "inner_aval") for v in closed.jaxpr.invars):
        return closed
    return state_discharge.discharge_state(closed)


def _core_body(ctx: CoreContext, jaxpr: jax_core.Jaxpr, kernel_args: list[Any],
               operands: list[Operand], points: np.ndarray):
    """The actor of one core: the grid walk with the block pipeline around each step."""
    blocked = [op for op in operands if not op.whole_array]
    inputs = [op for op in blocked if not op.is_output]
    outputs = [op for op in blocked if op.is_output]
    windowed = [op for op in operands if op.whole_array and op.block_indices is not None]
    visited: dict[int, set[tuple[int, ...]]] = {id(op): set() for op in outputs}
    num_steps = len(points)
    for step in range(num_steps):
        point = tuple(int(x) for x in points[step])
        ctx.grid_point = point
        ctx.eqn = None
        yield None  # a scheduling point: another core may run a step here
        for op in windowed:
            kernel_args[op.position] = _hbm_window(op, op.block_indices[step])  # type: ignore[index]
        for op in inputs:
            idx = op.block_indices[step]  # type: ignore[index]
            if step == 0 or not np.array_equal(idx, op.block_indices[step - 1]):  # type: ignore[index]
                _copy_in(ctx, op, tuple(int(i) for i in idx))
        for op in outputs:
            idx = op.block_indices[step]  # type: ignore[index]
            key = tuple(int(i) for i in idx)
            if step == 0 or not np.array_equal(idx, op.block_indices[step - 1]):  # type: ignore[index]
                if key in visited[id(op)]:
                    ctx.call.checkers.block_revisited(ctx, op, key, _index_map_frames(op))
                _check_block_bounds(ctx, op, key)
                assert op.vmem is not None
                op.vmem.data[...] = ctx.fill(op.vmem.data.dtype)
                op.vmem.mark_written(Ellipsis, False)
        yield from eval_jaxpr(ctx, jaxpr, (), kernel_args)
        ctx.eqn = None
        for op in outputs:
            idx = op.block_indices[step]  # type: ignore[index]
            last = step == num_steps - 1
            if last or not np.array_equal(idx, op.block_indices[step + 1]):  # type: ignore[index]
                key = tuple(int(i) for i in idx)
                _copy_out(ctx, op, key)
                visited[id(op)].add(key)
    if ctx.call.races is not None:
        ctx.call.races.end(ctx.actor)  # the core's grid is done: it accesses nothing more


def _hbm_window(op: Operand, block_index: Sequence[int]) -> RefView:
    """The kernel's ref for an HBM operand whose BlockSpec selects a window of it."""
    indices = tuple(int(start) if sq else state_indexing.Slice(int(start), size)
                    for (start, size), sq in zip(op.block_window(block_index), op.squeezed))
    return RefView(op.hbm, (state_indexing.NDIndexer.from_indices_shape(indices,
                                                                        op.hbm.shape),))


def _block_slices(op: Operand, block_index: tuple[int, ...]
                  ) -> tuple[tuple, tuple, bool]:
    """Slices of the HBM array and of the VMEM block for the valid part of a block."""
    hbm_index, vmem_index = [], []
    empty = False
    for (start, size), n, sq in zip(op.block_window(block_index), op.hbm.shape, op.squeezed):
        lo, hi = max(start, 0), min(start + size, n)
        if hi <= lo:
            empty = True
            lo = hi = 0
        if sq:
            hbm_index.append(lo)
        else:
            hbm_index.append(slice(lo, hi))
            vmem_index.append(slice(lo - start, hi - start) if not empty else slice(0, 0))
    return tuple(hbm_index), tuple(vmem_index), empty


def _check_block_bounds(ctx: CoreContext, op: Operand, block_index: tuple[int, ...]) -> bool:
    bad = []
    for d, ((start, size), n, elem) in enumerate(
            zip(op.block_window(block_index), op.hbm.shape, op.element)):
        if start < 0 or start >= n or (elem and start + size > n):
            bad.append(d)
    if not bad:
        return True
    ctx.call.add(ctx.call.checkers.block_out_of_bounds(ctx, op, block_index, bad,
                                                      _index_map_frames(op)))
    return False


def _copy_in(ctx: CoreContext, op: Operand, block_index: tuple[int, ...]) -> None:
    assert op.vmem is not None
    _check_block_bounds(ctx, op, block_index)
    vmem = op.vmem
    hbm_index, vmem_index, empty = _block_slices(op, block_index)
    vmem.data[...] = ctx.fill(vmem.data.dtype)
    vmem.mark_written(Ellipsis, False)
    if empty:
        return
    vmem.data[vmem_index] = op.hbm.data[hbm_index]
    vmem.mark_written(vmem_index, op.hbm.written_at(hbm_index))
    if ctx.call.races is not None:
        ctx.call.races.access(ctx.actor, op.hbm, _hbm_range(hbm_index), False,
                              "block copy-in", _index_map_frames(op), ctx.grid_point)


def _copy_out(ctx: CoreContext, op: Operand, block_index: tuple[int, ...]) -> None:
    assert op.vmem is not None
    hbm_index, vmem_index, empty = _block_slices(op, block_index)
    if empty:
        return
    hbm = op.hbm
    hbm.writable()[hbm_index] = op.vmem.data[vmem_index]
    hbm.mark_written(hbm_index, op.vmem.written_at(vmem_index))
    if ctx.call.races is not None:
        ctx.call.races.access(ctx.actor, hbm, _hbm_range(hbm_index), True,
                              "block write-back", _index_map_frames(op), ctx.grid_point)


def _hbm_range(index: tuple) -> IndexRange:
    return tuple((i, i + 1) if isinstance(i, int) else (i.start, i.stop) for i in index)


def _index_map_frames(op: Operand) -> tuple[SourceFrame, ...]:
    """Where the operand's BlockSpec index_map is defined (pipeline copies have no line)."""
    info = op.mapping.index_map_jaxpr.jaxpr.debug_info
    _, file, line = parse_src_info(getattr(info, "func_src_info", None))
    return (SourceFrame(file, line, "index_map", code_line(file, line)),) if file else ()


def _finish_dmas(ctx: CoreContext, report: bool = True) -> None:
    """DMAs still in flight complete at kernel end; those never waited are findings."""
    state = ctx.call
    for dma in state.sync.dmas:
        if not dma.copied:
            sync.complete(ctx, dma)
    if report:
        for finding in state.checkers.dmas_not_waited(state):
            state.add(finding)


