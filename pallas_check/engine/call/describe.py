"""The static description of one pallas_call: its operands, block mappings, grid and
cores, read from the primitive's params before anything runs."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pallas_check.jaxbridge.jaxprs import (arg_names, discharge_state, dynamic_grid_dim, is_ref_aval,
                                          jaxpr_as_fun, semaphore_dtype, source_text)
from pallas_check.jaxbridge import keys
from pallas_check.jaxbridge.call import CallParams, Block, describe
from pallas_check.jaxbridge.types import ClosedJaxpr, Jaxpr, ScalarSubcoreMesh, Slice, VectorSubcoreMesh
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.points import NotByNumpy, numpy_index_map
from pallas_check.engine.jaxpr.program import structure_key
from pallas_check.engine.memory.buffer import Buffer, memory_space_name
from pallas_check.engine.runtime.caches import BoundedCache
from pallas_check.findings.finding import KernelInfo
from pallas_check.findings.sourceinfo import parse_src_info


def is_semaphore_aval(aval: object) -> bool:
    dtype = getattr(aval, "dtype", None)
    try:
        return dtype is not None and jnp.issubdtype(dtype, semaphore_dtype)
    except TypeError:
        return False


def logical_keys(input_vars: Sequence[Any], first: int,
                 operands: list[np.ndarray]) -> list[np.ndarray]:
    """The operands as the kernel's refs hold them: a typed PRNG key input (its ref var
    among `input_vars`, its operand at `first` + its index), which arrives as its uint32
    words, as keys (jaxbridge/keys.py)."""
    for k, var in enumerate(input_vars):
        if keys.is_key_aval(var.aval) and operands[first + k].dtype.fields is None:
            operands[first + k] = keys.to_logical(operands[first + k], var.aval.dtype)
    return operands


@dataclasses.dataclass
class Operand:
    """An input or output of the call: its HBM array and how blocks map onto it."""

    name: str
    position: int  # index among the kernel's parameters
    is_output: bool
    mapping: Block  # how its blocks map onto the array (the bridge's BlockMapping)
    hbm: Buffer
    kernel_space: str
    block_sizes: tuple[int, ...]  # one per array dim (squeezed dims are 1)
    squeezed: tuple[bool, ...]
    element: tuple[bool, ...]
    block_indices: np.ndarray | None = None  # (num_steps, ndim [+ BoundedSlice sizes])
    vmem: Buffer | None = None
    # Per array dim, `pl.Element(n, padding=(lo, hi))`'s virtual padding: the index map's
    # element offset counts from lo elements before the array, and a block may reach into
    # the padding (never-written values, not out of bounds) but not beyond it.
    padding: tuple[tuple[int, int], ...] = ()
    # Per array dim, whether it is a `pl.BoundedSlice(n)`: the index map returns
    # `pl.ds(start, size)` with size <= n; a block index then carries, after one start
    # per dim, the size of each such dim in order (the block is [start, start + size),
    # the rest of the kernel's n-element ref is never-written memory).
    bounded: tuple[bool, ...] = ()

    @property
    def whole_array(self) -> bool:
        return self.vmem is None

    def block_window(self, block_index: Sequence[int]) -> list[tuple[int, int]]:
        """(start, size) per array dim for a block index (an Element dim's start in the
        array's own coordinates: negative in its low padding; a BoundedSlice dim's size
        its slice's)."""
        if self.bounded:
            sizes = iter(block_index[len(self.block_sizes):])
            return [(int(bi), int(next(sizes))) if bounded else (int(bi) * size, size)
                    for bi, size, bounded in zip(block_index, self.block_sizes, self.bounded)]
        if self.padding:
            return [(int(bi) - pad[0] if elem else int(bi) * size, size) for bi, size, elem, pad
                    in zip(block_index, self.block_sizes, self.element, self.padding)]
        return [(int(bi) if elem else int(bi) * size, size)
                for bi, size, elem in zip(block_index, self.block_sizes, self.element)]

    def describe(self, block_index: Sequence[int]) -> str:
        """A block index as its index map returned it (a BoundedSlice dim's `pl.ds`)."""
        if not self.bounded:
            return str(tuple(int(i) for i in block_index))
        sizes = iter(block_index[len(self.block_sizes):])
        return "(" + ", ".join(f"pl.ds({int(i)}, {int(next(sizes))})" if bounded else str(int(i))
                               for i, bounded in zip(block_index, self.bounded)) + ")"

    def element_bounds(self) -> list[tuple[int, int]]:
        """Per array dim, the [low, high) an Element block must stay within: the array
        and its virtual padding."""
        pads = self.padding or ((0, 0),) * len(self.block_sizes)
        return [(-lo, n + hi) for (lo, hi), n in zip(pads, self.hbm.shape)]


def unvisited_blocks(op: Operand, limit: int = 4
                     ) -> tuple[tuple[tuple[int, ...], ...], int] | None:
    """The blocks of a blocked operand that no grid point's index map selects: the first
    `limit` (in row-major order) and how many. None where its blocks are no plain tiling
    of the array (Element or BoundedSlice dims) or it has no block indices."""
    indices = op.block_indices
    if indices is None or any(op.element) or any(op.bounded):
        return None
    counts = tuple(-(-n // b) for n, b in zip(op.hbm.shape, op.block_sizes))
    seen = np.zeros(counts, bool)
    blocks = indices[:, :len(counts)].astype(np.int64)
    inside = np.all((blocks >= 0) & (blocks < np.array(counts, np.int64)), axis=1)
    seen[tuple(blocks[inside].T)] = True
    missing = np.argwhere(~seen)
    return tuple(tuple(int(i) for i in b) for b in missing[:limit]), len(missing)


# Index maps by identity (a jitted loop lowers once), then by structure and constants (an
# eager call traces its index maps anew every time).
_index_maps_seen = BoundedCache(512)
_index_map_fns = BoundedCache(512)
_numpy_maps = BoundedCache(512)


def _index_map_fn(index_map_jaxpr: ClosedJaxpr, num_grid: int, num_scalars: int) -> Any:
    """All grid points' block indices in one vectorised, compiled call."""

    def by_structure() -> Any:
        key = (structure_key(index_map_jaxpr.jaxpr), _consts_key(index_map_jaxpr.consts),
               num_grid, num_scalars)
        return _index_map_fns.get_or_make(key, compile_it)

    def compile_it() -> Any:
        closed = _discharged(index_map_jaxpr)
        n_out = len(index_map_jaxpr.jaxpr.outvars)

        def one(*args: Any) -> list[Any]:
            return jaxpr_as_fun(closed)(*args)[:n_out]

        in_axes = (0,) * num_grid + (None,) * num_scalars
        return _Vectorised(jax.jit(jax.vmap(one, in_axes=in_axes)), _looped(one, num_grid))

    return _index_maps_seen.for_object(index_map_jaxpr, (num_grid, num_scalars), by_structure)


def _looped(one: Any, num_grid: int) -> Any:
    """The index map over all grid points as a compiled loop: a scan needs no batching
    rule, so a primitive that JAX allows in an index map but cannot vmap
    (`pl.multiple_of`) still evaluates."""

    def over_points(*args: Any) -> Any:
        cols, scalars = args[:num_grid], args[num_grid:]
        return jax.lax.map(lambda point: tuple(one(*point, *scalars)), tuple(cols))

    return jax.jit(over_points)


class _Vectorised:
    """The vmapped index map, or, once vmap has refused one of its primitives (no
    batching rule), the looped one from then on."""

    def __init__(self, vmapped: Any, looped: Any) -> None:
        self.fn, self.looped = vmapped, looped

    def __call__(self, *args: Any) -> Any:
        if self.fn is not self.looped:
            try:
                return self.fn(*args)
            except NotImplementedError:
                self.fn = self.looped
        return self.fn(*args)


def _consts_key(consts: Sequence[object]) -> tuple[object, ...]:
    values = [np.asarray(c) for c in consts]
    return tuple((v.shape, v.dtype.str, v.tobytes()) for v in values)


def kernel_info(params: CallParams) -> KernelInfo:
    call = describe(params)
    name, file, line = parse_src_info(source_text(call.kernel))
    if call.name:
        name = call.name
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


def _read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view of an operand, so that the first write copies it (the operands
    are shared by every schedule and fill the call is simulated under)."""
    view = array.view()
    view.flags.writeable = False
    return view


def core_mesh_axes(params: CallParams) -> tuple[str, ...]:
    """Axis names of a TensorCore mesh the call runs over (core_map / pl.kernel), or ()."""
    mesh = describe(params).mesh
    if mesh is None:
        return ()
    names = getattr(mesh, "axis_names", None) or tuple(getattr(mesh, "shape", {}) or ())
    return tuple(names)


@dataclasses.dataclass(frozen=True)
class SparseCoreMesh:
    """The SparseCore mesh a `pl.kernel` runs over: `num_cores` SparseCores of the chip,
    each with `num_subcores` vector subcores (a ScalarSubcoreMesh: one scalar subcore per
    SparseCore, `subcore_axis` None). Its points are the kernel's actors."""

    scalar: bool
    core_axis: str
    subcore_axis: str | None
    num_cores: int
    num_subcores: int

    def actor_name(self, core: int, subcore: int = 0) -> str:
        """An actor's name on its device: `sparsecore 1 subcore 7` (a scalar subcore:
        `sparsecore 1 scalar subcore`)."""
        if self.scalar:
            return f"sparsecore {core} scalar subcore"
        return f"sparsecore {core} subcore {subcore}"


def sparsecore_mesh(params: CallParams) -> SparseCoreMesh | None:
    """The call's SparseCore mesh (`plsc.VectorSubcoreMesh` / `ScalarSubcoreMesh`), or None
    for a TensorCore call. Read from the mesh's own fields: the core type tells the kind."""
    mesh = describe(params).mesh
    if isinstance(mesh, VectorSubcoreMesh):
        return SparseCoreMesh(False, mesh.core_axis_name, mesh.subcore_axis_name,
                              mesh.num_cores, mesh.num_subcores)
    if isinstance(mesh, ScalarSubcoreMesh):
        return SparseCoreMesh(True, mesh.axis_name, None, mesh.num_cores, 1)
    return None


def resolve_grid(grid: Sequence[Any], bounds: Sequence[np.ndarray]) -> tuple[int, ...]:
    """The grid with its dynamic dimensions replaced by the call's bound operands."""
    values = iter(bounds)
    out = []
    for dim in grid:
        if isinstance(dim, tuple):  # a named mesh axis of a core_map kernel: (name, size)
            out.append(int(dim[1]))
        elif dim is dynamic_grid_dim:
            out.append(int(next(values)))
        else:
            out.append(int(dim))
    return tuple(out)


def _operand(name: str, position: int, is_output: bool, block: Block, hbm: Buffer,
             var: Any) -> Operand:
    space = memory_space_name(getattr(var.aval, "memory_space", None))
    block_sizes: list[int] = []
    squeezed: list[bool] = []
    element: list[bool] = []
    padding: list[tuple[int, int]] = []
    bounded: list[bool] = []
    for dim in block.dims:
        if dim.kind == "unknown":
            raise KernelError(f"block dimension {dim.raw!r} of {name} is not supported")
        bounded.append(dim.kind == "bounded")
        block_sizes.append(dim.size)
        squeezed.append(dim.kind == "squeezed")
        element.append(dim.kind in ("element", "bounded"))
        padding.append(dim.padding)
    return Operand(name, position, is_output, block, hbm, space, tuple(block_sizes),
                   tuple(squeezed), tuple(element),
                   padding=tuple(padding) if any(p != (0, 0) for p in padding) else (),
                   bounded=tuple(bounded) if any(bounded) else ())


def dimension_semantics(params: CallParams) -> tuple[str, ...]:
    """'parallel' / 'core_parallel' / 'arbitrary' per grid axis (arbitrary when unsaid).
    Compiler params given as a dict are read by the bridge under either of JAX's keys."""
    call = describe(params)
    grid, names = call.grid, call.semantics
    if not names:
        return ("arbitrary",) * len(grid)
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


def kernel_arg_names(jaxpr: Jaxpr) -> list[str]:
    return arg_names(jaxpr)


def _grid_points(grid: tuple[int, ...]) -> np.ndarray:
    if not grid:
        return np.zeros((1, 0), np.int32)
    return np.indices(grid, dtype=np.int32).reshape(len(grid), -1).T.copy()


def _block_indices(block: Block, points: np.ndarray, scalars: list[np.ndarray]) -> np.ndarray:
    num_grid = points.shape[1]
    index_map = block.index_map
    cols = [points[:, d] for d in range(num_grid)]
    if num_grid == 0:
        # vmap needs a mapped axis: evaluate once.
        outs = jaxpr_as_fun(
            _discharged(index_map))(*scalars)[: len(index_map.jaxpr.outvars)]
        stacked = np.array([[int(np.asarray(o)) for o in outs]], dtype=np.int64)
    else:
        found = _by_numpy(index_map, cols, scalars)
        columns = found if found is not None else _index_map_fn(
            index_map, num_grid, len(scalars))(*cols, *scalars)
        stacked = np.stack([np.asarray(o).astype(np.int64).reshape(-1) for o in columns],
                           axis=1)
    order = _index_columns(block)
    return stacked if order is None else _reorder(stacked, order)


def _by_numpy(index_map: ClosedJaxpr, cols: list[np.ndarray],
              scalars: list[np.ndarray]) -> list[np.ndarray] | None:
    """The block indices by numpy (engine/jaxpr/points.py: no XLA compile on a
    structure's first call), or None where the compiled map must answer."""
    run = _numpy_maps.for_object(index_map, len(cols), lambda: (numpy_index_map(
        _discharged(index_map), len(index_map.jaxpr.outvars), len(cols)),))[0]
    if run is None:
        return None
    try:
        return run(cols, scalars)
    except NotByNumpy:
        return None


class _Column:
    """A placeholder for the index map's k-th output while its pytree is read."""

    def __init__(self, k: int) -> None:
        self.k = k


def _index_columns(block: Block) -> list[tuple[int, int]] | None:
    """Where each value of a block index sits among the index map's flat outputs, when some
    dim returns a `pl.ds` (BoundedSlice): its start per dim, then its size per
    BoundedSlice dim, each as (column, -1) or, a static value, (-1, value); None when the
    outputs are one int per dim."""
    if not any(dim.kind == "bounded" for dim in block.dims):
        return None
    tree = block.index_tree
    per_dim = tree.unflatten([_Column(k) for k in range(tree.num_leaves)])
    starts, sizes = [], []
    for value in per_dim:
        if isinstance(value, Slice):
            starts.append((value.start.k, -1) if isinstance(value.start, _Column)
                          else (-1, int(value.start)))
            sizes.append((value.size.k, -1) if isinstance(value.size, _Column)
                         else (-1, int(value.size)))
        else:
            starts.append((value.k, -1))
    return starts + sizes


def _reorder(stacked: np.ndarray, order: list[tuple[int, int]]) -> np.ndarray:
    """The block indices in the Operand's layout (see `Operand.bounded`)."""
    return np.stack([stacked[:, k] if k >= 0 else np.full(len(stacked), static, np.int64)
                     for k, static in order], axis=1)


def _discharged(closed: ClosedJaxpr) -> ClosedJaxpr:
    """The index map with scalar-prefetch refs turned into plain array arguments."""
    if not any(is_ref_aval(v.aval) for v in closed.jaxpr.invars):
        return closed
    return discharge_state(closed)

