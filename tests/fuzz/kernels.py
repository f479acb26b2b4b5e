"""A small description language for valid Pallas TPU kernels, a hypothesis strategy that
draws descriptions, and two interpreters of a description:

- `build(desc)` makes the pallas_call (kernel body, BlockSpecs, index maps, scratch,
  scalar prefetch, DMAs, aliases) from the description — no generated source text, no
  exec;
- `reference(desc, tables, arrays)` computes the outputs by walking the grid on numpy
  blocks (the fallback oracle where JAX's TPU interpreter cannot run a case).

A kernel computes an output of shape ([B,] M, N). Each of its dims is walked by a grid
axis (the batch dim squeezed or in blocks of 1-2; M, N in (8,128)-multiple blocks, maybe
with a partial edge block) or taken whole (a full-dim block). The grid has rank 1-3;
its 'parallel' axes form a prefix and carry no state, so kernels are valid on 1 or 2
cores. An optional reduction axis (the last grid axis, 'arbitrary') accumulates into the
output or into a VMEM scratch, initialised under `pl.when(k == 0)`. Each grid step
computes a value of the output block's shape from *terms* (input blocks under identity,
transposed-axis, constant, offset and scalar-prefetch index maps; windows DMA'd from
`pl.ANY` inputs in several ways, or sliced from whole-array VMEM inputs; dot products)
combined by a chain of *ops* (elementwise, dots with a weight, fori_loops, in-block sums,
rolls, program ids, SMEM scalars), and stores it (whole, by rows in a fori_loop, under a
lax.cond, or by masked stores). Optional: a second output (term 0's value, plain,
transposed or DMA'd to a `pl.ANY` output), an input/output alias, a REGULAR semaphore,
and calling the kernel under jit or vmap.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

F32, BF16, I32 = "float32", "bfloat16", "int32"
DTYPES = (F32, BF16, I32)


# ---------------------------------------------------------------------------------------
# The description (frozen dataclasses whose repr is valid Python: paste into @example).


@dataclasses.dataclass(frozen=True)
class Index:
    """The block index of one array dim at a grid point."""

    kind: str  # "axis": program_id(axis) + offset | "const": offset | "prefetch": table[pid]
    axis: int = -1
    offset: int = 0
    table: int = -1  # prefetch: which scalar-prefetch table (indexed by program_id(axis))


@dataclasses.dataclass(frozen=True)
class Dim:
    """One dim of the output."""

    size: int
    block: int  # block size; 0: a squeezed dim (pl.Squeezed, one element per step)
    axis: int = -1  # the grid axis walking it; -1: a full-dim block (always index 0)


@dataclasses.dataclass(frozen=True)
class Term:
    """A value of the output block's shape, read at each grid step (except "weight" and
    "smem" terms, which ops read)."""

    # "block" (a BlockSpec'd block) | "dma" (DMA'd from a pl.ANY input) | "vmem" (sliced
    # with pl.ds from a whole-array VMEM input) | "dot" | "weight" (an (N, N) matrix for
    # the `matmul` op) | "smem" (a whole-array int32 SMEM vector of length k, for the
    # `smem` op: v + s[sum(program ids) % k]) | "pipeline" (the sum of k blocks of a
    # pl.ANY input, brought in by a nested pltpu.emit_pipeline)
    kind: str
    index: tuple[Index, ...] = ()  # one per output dim (dot: x's [B,] M and y's N)
    transposed: bool = False  # block: the array is stored (.., N, M); the value is .T
    stacked: bool = False  # block/dma: a leading dim walked by the reduction axis
    extra: int = 0  # blocks past the last one an index map reaches
    k: int = 0  # dot: K block size (split over the reduction axis) or the full K
    k_split: bool = False
    # dma: "single" | "loop" (start+wait per chunk) | "split" (start all chunks, then
    # wait for all) | "pipelined" (double-buffered across grid steps: step s starts the
    # copy for step s+1 into the other slot, then waits for its own) | "sync"
    # (pltpu.sync_copy) | "scoped" (buffer and semaphore from pl.run_scoped)
    dma: str = ""
    chunk: int = 0  # dma loops: rows per DMA; block "rows"/"at"/"cols": chunk or split
    # block: how the ref is read: "whole" | "rows" (a fori_loop copies row chunks into
    # VMEM scratch) | "strided" (even and odd rows, interleaved) | "at" (two `.at[]` row
    # views, concatenated) | "cols" (two static column slices, concatenated)
    read: str = "whole"


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    arg: int = -1  # a term (binary ops, fori, matmul); -1: the constant
    const: int = 1


@dataclasses.dataclass(frozen=True)
class Kernel:
    dtype: str
    grid: tuple[int, ...]
    semantics: tuple[str, ...]
    out: tuple[Dim, ...]
    reduce: int  # the reduction grid axis (the last one), or -1
    tables: tuple[tuple[int, tuple[int, ...]], ...]  # (grid axis, values) per table
    terms: tuple[Term, ...]
    ops: tuple[Op, ...]
    acc: str  # "none" | "out" | "scratch"
    # "whole" | "rows" (staged in VMEM scratch, stored in a fori_loop) | "cond" (a
    # lax.cond on the program ids picks "whole" or "rows") | "masked" (two pltpu.store
    # with complementary row masks: rows < chunk, rows >= chunk)
    store: str
    chunk: int  # rows per store ("rows")
    seed: int
    # a second output holding term 0's value: "none" | "plain" | "transposed" | "dma"
    # (a pl.ANY output, DMA'd from VMEM scratch; its dims rounded up to whole blocks)
    side: str = "none"
    # how the call is made: "none" (eagerly) | "jit" | "vmap" (over a batch of 2 of every
    # input array; the scalar-prefetch tables are shared) | "vmap_all" (the tables are
    # batched too: the second batch element reads them reversed)
    wrap: str = "none"
    alias: int = -1  # a term whose (identity-mapped) input array the output aliases
    sem: int = 0  # > 0: signal a REGULAR semaphore by this much first, wait for it last


# ---------------------------------------------------------------------------------------
# The operands of a description.


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """One input of the pallas_call: its shape, block shape (0: squeezed) and index."""

    shape: tuple[int, ...]
    block: tuple[int, ...]
    index: tuple[Index, ...]


def _nblocks(desc: Kernel, ix: Index) -> int:
    """Blocks an array dim needs so that the index never leaves it."""
    if ix.kind == "axis":
        return desc.grid[ix.axis] + ix.offset
    if ix.kind == "const":
        return ix.offset + 1
    return max(desc.tables[ix.table][1]) + 1


def _dim_array(desc: Kernel, od: Dim, ix: Index, extra: int, exact_ok: bool
               ) -> tuple[int, int]:
    """(size, block) of an input dim parallel to output dim `od`."""
    if od.axis == -1:
        return od.size, od.size
    if exact_ok and extra == 0 and ix == Index("axis", od.axis):
        return od.size, od.block  # the identity map: the same edge block as the output
    return (_nblocks(desc, ix) + extra) * (od.block or 1), od.block


def term_arrays(desc: Kernel, term: Term) -> list[ArraySpec]:
    if term.kind == "smem":
        return [ArraySpec((term.k,), (term.k,), (Index("const"),))]
    if term.kind == "weight":
        n = desc.out[-1].block if desc.out[-1].axis != -1 else desc.out[-1].size
        return [ArraySpec((n, n), (n, n), (Index("const"), Index("const")))]
    if term.kind == "dot":
        xs, xb, xi = [], [], []
        for od, ix in zip(desc.out[:-1], term.index[:-1]):
            s, b = _dim_array(desc, od, ix, 0, True)
            xs.append(s), xb.append(b), xi.append(ix)
        nk = desc.grid[desc.reduce] if term.k_split else 1
        kix = Index("axis", desc.reduce) if term.k_split else Index("const")
        s, b = _dim_array(desc, desc.out[-1], term.index[-1], 0, True)
        return [ArraySpec((*xs, term.k * nk), (*xb, term.k), (*xi, kix)),
                ArraySpec((term.k * nk, s), (term.k, b), (kix, term.index[-1]))]
    shape, block, index = [], [], []
    if term.kind == "pipeline":  # the inner pipeline's axis (the kernel takes it whole)
        shape.append(term.k), block.append(0), index.append(Index("const"))
    if term.stacked:
        shape.append(desc.grid[desc.reduce]), block.append(0)
        index.append(Index("axis", desc.reduce))
    for od, ix in zip(desc.out, term.index):
        # A DMA'd window must lie inside its array: no edge blocks there.
        s, b = _dim_array(desc, od, ix, term.extra, term.kind == "block")
        shape.append(s), block.append(b), index.append(ix)
    if term.transposed:
        shape[-2:], block[-2:], index[-2:] = shape[:-3:-1], block[:-3:-1], index[:-3:-1]
    return [ArraySpec(tuple(shape), tuple(block), tuple(index))]


def operands(desc: Kernel) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(scalar-prefetch tables, input arrays) of a description, from its seed."""
    rng = np.random.default_rng(desc.seed)
    arrays = []
    batch = (2,) if desc.wrap.startswith("vmap") else ()
    for term in desc.terms:
        for spec in term_arrays(desc, term):
            shape = batch + spec.shape
            if desc.dtype == I32 or term.kind == "smem":
                arrays.append(np.asarray(rng.integers(-5, 6, shape), np.int32))
            else:  # quarters: exact in bf16, and in f32 sums of products
                values = rng.integers(-8, 9, shape) / 4
                arrays.append(np.asarray(jnp.asarray(values, desc.dtype)))
    tables = [np.asarray(values, np.int32) for _, values in desc.tables]
    if desc.wrap == "vmap_all":
        tables = [np.stack([t, t[::-1]]) for t in tables]
    return tables, arrays


def out_block_shape(desc: Kernel) -> tuple[int, int]:
    m, n = (d.block if d.axis != -1 else d.size for d in desc.out[-2:])
    return m, n


def value_shape(desc: Kernel) -> tuple[int, ...]:
    """The shape of the output block as the kernel sees it (squeezed dims dropped)."""
    return tuple(d.block if d.axis != -1 else d.size for d in desc.out
                 if d.axis == -1 or d.block != 0)


def _t(v: Any) -> Any:
    return jnp.swapaxes(v, -1, -2)


def _rows(index: Any, ndim: int) -> tuple:
    """An index of the second-minor dim of a ref of rank `ndim`."""
    return (slice(None),) * (ndim - 2) + (index,)


def acc_dtype(desc: Kernel) -> str:
    if desc.acc == "scratch":
        return I32 if desc.dtype == I32 else F32
    return desc.dtype


def index_value(ix: Index, pids: Sequence[Any], tables: Sequence[Any]) -> Any:
    if ix.kind == "axis":
        return pids[ix.axis] + ix.offset
    if ix.kind == "const":
        return ix.offset
    return tables[ix.table][pids[ix.axis]]


def _starts(counts: Sequence[int]) -> list[int]:
    """Start offsets of consecutive groups of the given sizes."""
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


# ---------------------------------------------------------------------------------------
# The op chain: the same code computes in the kernel (traced) and in the reference.


def _scalar(x: Any, dtype: str) -> Any:
    return jnp.asarray(x).astype(dtype)


def compute(desc: Kernel, values: dict[int, Any], pids: Sequence[Any],
            in_kernel: bool = True) -> Any:
    cdt = desc.dtype
    v = values[0]
    for op in desc.ops:
        other = values[op.arg] if op.arg >= 0 and op.name != "smem" else _scalar(op.const, cdt)
        name = op.name
        if name == "add":
            v = v + other
        elif name == "sub":
            v = v - other
        elif name == "mul":
            v = v * other
        elif name == "max":
            v = jnp.maximum(v, other)
        elif name == "min":
            v = jnp.minimum(v, other)
        elif name == "select":
            v = jnp.where(v > other, v, other * _scalar(2, cdt))
        elif name == "and":
            v = v & other
        elif name == "xor":
            v = v ^ other
        elif name == "neg":
            v = -v
        elif name == "abs":
            v = jnp.abs(v)
        elif name == "square":
            v = v * v
        elif name == "tanh":
            v = jnp.tanh(v)
        elif name == "exp":
            v = jnp.exp(jnp.minimum(v, _scalar(3, cdt)))
        elif name == "rowsum":  # mixes the rows (M) of the block
            v = jnp.broadcast_to(jnp.sum(v, axis=-2, keepdims=True), v.shape)
        elif name == "colsum":  # mixes the columns (N)
            v = jnp.broadcast_to(jnp.sum(v, axis=-1, keepdims=True), v.shape)
        elif name == "pid":
            total = 0
            for a, p in enumerate(pids):
                total = total + p * (a * 3 + op.const)
            v = v + _scalar(total, cdt)
        elif name == "fori":
            def body(t, c, step=other):
                return c + step * _scalar(t + 1, cdt)

            v = lax.fori_loop(0, op.const, body, v)
        elif name in ("roll0", "roll1"):  # pltpu.roll is jnp.roll, in kernels only
            roll = pltpu.roll if in_kernel else jnp.roll
            axis = v.ndim - 2 + int(name[-1])
            v = roll(v, op.const % v.shape[axis], axis)
        elif name == "smem":
            total = sum(pids) % desc.terms[op.arg].k
            v = v + values[op.arg][total].astype(cdt)
        elif name == "matmul":  # mixes the columns (N)
            v = jnp.dot(v, values[op.arg], preferred_element_type=jnp.float32).astype(cdt)
        else:
            raise ValueError(name)
    return v


MIXES_M = {"rowsum", "roll0"}
MIXES_N = {"colsum", "matmul", "roll1"}


# ---------------------------------------------------------------------------------------
# build: the pallas_call of a description.


def _block_shape(block: Sequence[int]) -> tuple:
    return tuple(pl.Squeezed() if b == 0 else b for b in block)


def _index_map(index: Sequence[Index], rank: int) -> Callable[..., tuple]:
    def imap(*args):
        pids, tables = args[:rank], args[rank:]
        return tuple(index_value(ix, pids, tables) for ix in index)

    return imap


def _window(spec: ArraySpec, pids: Sequence[Any], tables: Sequence[Any],
            rows: tuple[Any, int] | None = None) -> tuple:
    """The `.at[...]` window of an HBM array selecting one block, or `rows` (first row
    within the block, number of rows) of it."""
    window: list[Any] = []
    row_dim = [d for d, b in enumerate(spec.block) if b != 0][-2]
    for d, (b, ix) in enumerate(zip(spec.block, spec.index)):
        e = index_value(ix, pids, tables)
        if b == 0:
            window.append(e)
        elif d == row_dim and rows is not None:
            window.append(pl.ds(e * b + rows[0], rows[1]))
        else:
            window.append(pl.ds(e * b, b))
    return tuple(window)


def _ref_shape(spec: ArraySpec) -> tuple[int, ...]:
    return tuple(b for b in spec.block if b != 0)


def _read(term: Term, ref: Any, spec: ArraySpec, scratch: Any) -> Any:
    """The value of a block term's ref, read the way the term says."""
    shape = _ref_shape(spec)
    nd, (r, c) = len(shape), shape[-2:]
    if term.read == "rows":
        def body(i, carry):
            rows = _rows(pl.ds(i * term.chunk, term.chunk), nd)
            scratch[rows] = ref[rows]
            return carry

        lax.fori_loop(0, r // term.chunk, body, 0)
        return scratch[...]
    if term.read == "strided":
        even = ref[_rows(pl.ds(0, r // 2, stride=2), nd)]
        odd = ref[_rows(pl.ds(1, r // 2, stride=2), nd)]
        return jnp.stack([even, odd], axis=-2).reshape(shape)
    if term.read == "at":
        h = term.chunk
        return jnp.concatenate([ref.at[_rows(pl.ds(0, h), nd)][...],
                                ref.at[_rows(pl.ds(h, r - h), nd)][...]], -2)
    if term.read == "cols":
        w = term.chunk
        return jnp.concatenate([ref[..., :w], ref[..., pl.ds(w, c - w)]], -1)
    return ref[...]


def _unravel(step: Any, grid: Sequence[int]) -> tuple[Any, ...]:
    out = []
    for size in reversed(grid):
        out.append(step % size)
        step = step // size
    return tuple(reversed(out))


def build(desc: Kernel) -> Callable[..., Any]:
    """`fn(*tables, *arrays, interpret=...)` calling the described pallas_call."""
    rank = len(desc.grid)
    bm, _ = out_block_shape(desc)
    vs = value_shape(desc)
    nd = len(vs)
    specs = [term_arrays(desc, t) for t in desc.terms]
    first = _starts([len(s) for s in specs])
    n_in = sum(len(s) for s in specs)
    n_out = 1 if desc.side == "none" else 2
    nt = len(desc.tables)
    odt, adt = desc.dtype, acc_dtype(desc)
    strides = [int(np.prod(desc.grid[a + 1:])) for a in range(rank)]
    total = int(np.prod(desc.grid))

    # Scratch: [accumulator] [staging of row stores] [per term: what it needs].
    scratch_shapes: list[Any] = []

    def alloc(*shapes: Any) -> int:
        scratch_shapes.extend(shapes)
        return len(scratch_shapes) - len(shapes)

    acc_at = alloc(pltpu.VMEM(vs, adt)) if desc.acc == "scratch" else -1
    stage_at = alloc(pltpu.VMEM(vs, odt)) if desc.store in ("rows", "cond") else -1
    side_at = (alloc(pltpu.VMEM(vs, odt), pltpu.SemaphoreType.DMA)
               if desc.side == "dma" else -1)
    sem_at = alloc(pltpu.SemaphoreType.REGULAR) if desc.sem else -1
    term_at: dict[int, int] = {}
    for ti, t in enumerate(desc.terms):
        if t.kind == "dma" and t.dma == "pipelined":
            term_at[ti] = alloc(pltpu.VMEM((2, *vs), odt), pltpu.SemaphoreType.DMA((2,)))
        elif t.kind == "dma" and t.dma != "scoped":
            term_at[ti] = alloc(pltpu.VMEM(vs, odt), pltpu.SemaphoreType.DMA)
        elif t.kind == "pipeline":
            term_at[ti] = alloc(pltpu.VMEM(vs, odt))
        elif t.kind == "block" and t.read == "rows":
            term_at[ti] = alloc(pltpu.VMEM(_ref_shape(specs[ti][0]), odt))

    def kernel(*refs):
        tables = refs[:nt]
        ins = refs[nt:nt + n_in]
        o_ref = refs[nt + n_in]
        side_ref = refs[nt + n_in + 1] if n_out == 2 else None
        scratch = refs[nt + n_in + n_out:]
        pids = tuple(pl.program_id(a) for a in range(rank))
        step = sum(p * st_ for p, st_ in zip(pids, strides))
        if desc.sem:
            pl.semaphore_signal(scratch[sem_at], desc.sem)

        def copy_of(ti: int, row: Any = None, at: Sequence[Any] = pids, slot: Any = None):
            t = desc.terms[ti]
            src = ins[first[ti]]
            buf, sem = scratch[term_at[ti]], scratch[term_at[ti] + 1]
            if slot is not None:
                return pltpu.make_async_copy(src.at[_window(specs[ti][0], at, tables)],
                                             buf.at[slot], sem.at[slot])
            if row is None:
                return pltpu.make_async_copy(src.at[_window(specs[ti][0], at, tables)],
                                             buf, sem)
            window = _window(specs[ti][0], at, tables, (row, t.chunk))
            return pltpu.make_async_copy(src.at[window], buf.at[_rows(pl.ds(row, t.chunk), nd)],
                                         sem)

        for ti, t in enumerate(desc.terms):  # DMAs that start before anything is read
            if t.kind == "dma" and t.dma == "single":
                copy_of(ti).start()
            elif t.kind == "dma" and t.dma == "pipelined":
                @pl.when(step == 0)
                def _(ti=ti):
                    copy_of(ti, slot=0).start()

                @pl.when(step + 1 < total)
                def _(ti=ti):
                    copy_of(ti, at=_unravel(step + 1, desc.grid), slot=(step + 1) % 2).start()

        values: dict[int, Any] = {}
        for ti, t in enumerate(desc.terms):
            j = first[ti]
            if t.kind == "block":
                v = _read(t, ins[j], specs[ti][0],
                          scratch[term_at[ti]] if ti in term_at else None)
                values[ti] = _t(v) if t.transposed else v
            elif t.kind == "weight":
                values[ti] = ins[j][...]
            elif t.kind == "smem":
                values[ti] = ins[j]  # read by the `smem` op
            elif t.kind == "vmem":
                values[ti] = ins[j][_window(specs[ti][0], pids, tables)]
            elif t.kind == "pipeline":
                acc_ref = scratch[term_at[ti]]
                acc_ref[...] = jnp.zeros(vs, odt)
                spec = specs[ti][0]
                outer = ArraySpec(spec.shape[1:], spec.block[1:], spec.index[1:])
                view = ins[j].at[(slice(None), *_window(outer, pids, tables))]

                def inner(x_ref, acc_ref=acc_ref):
                    acc_ref[...] += x_ref[...]

                pltpu.emit_pipeline(
                    inner, grid=(t.k,),
                    in_specs=[pl.BlockSpec((pl.Squeezed(), *vs), lambda s: (s,) + (0,) * nd)],
                )(view)
                values[ti] = acc_ref[...]
            elif t.kind == "dot":
                values[ti] = jnp.dot(ins[j][...], ins[j + 1][...],
                                     preferred_element_type=jnp.float32).astype(odt)
            elif t.dma == "pipelined":
                slot = step % 2
                copy_of(ti, slot=slot).wait()
                values[ti] = scratch[term_at[ti]][slot]
            else:
                if t.dma == "sync":
                    pltpu.sync_copy(ins[j].at[_window(specs[ti][0], pids, tables)],
                                    scratch[term_at[ti]])
                elif t.dma == "scoped":
                    def scoped(buf, sem, ti=ti, j=j):
                        copy = pltpu.make_async_copy(
                            ins[j].at[_window(specs[ti][0], pids, tables)], buf, sem)
                        copy.start()
                        copy.wait()
                        return buf[...]

                    values[ti] = pl.run_scoped(scoped, pltpu.VMEM(vs, odt),
                                               pltpu.SemaphoreType.DMA)
                    continue
                elif t.dma == "single":
                    copy_of(ti).wait()
                elif t.dma == "loop":
                    def one(c, carry, ti=ti, t=t):
                        copy = copy_of(ti, c * t.chunk)
                        copy.start()
                        copy.wait()
                        return carry

                    lax.fori_loop(0, bm // t.chunk, one, 0)
                else:  # "split": start every chunk, then wait for every chunk
                    def start(c, carry, ti=ti, t=t):
                        copy_of(ti, c * t.chunk).start()
                        return carry

                    def wait(c, carry, ti=ti, t=t):
                        copy_of(ti, c * t.chunk).wait()
                        return carry

                    lax.fori_loop(0, bm // t.chunk, start, 0)
                    lax.fori_loop(0, bm // t.chunk, wait, 0)
                values[ti] = scratch[term_at[ti]][...]
        if desc.side == "dma":
            buf, sem = scratch[side_at], scratch[side_at + 1]
            buf[...] = values[0]
            window = _window(output_arrays(desc)[1], pids, tables)
            copy = pltpu.make_async_copy(buf, side_ref.at[window], sem)
            copy.start()
            copy.wait()
        elif side_ref is not None:
            side_ref[...] = _t(values[0]) if desc.side == "transposed" else values[0]
        contrib = compute(desc, values, pids)

        def write_rows(value):
            stage = scratch[stage_at]
            stage[...] = value

            def body(c, carry):
                rows = _rows(pl.ds(c * desc.chunk, desc.chunk), nd)
                o_ref[rows] = stage[rows]
                return carry

            lax.fori_loop(0, bm // desc.chunk, body, 0)

        def write_whole(value):
            o_ref[...] = value

        def write(value):
            if desc.store == "whole":
                write_whole(value)
            elif desc.store == "rows":
                write_rows(value)
            elif desc.store == "masked":
                row = lax.broadcasted_iota(jnp.int32, vs, nd - 2)
                pltpu.store(o_ref, value, mask=row < desc.chunk)
                pltpu.store(o_ref, value, mask=row >= desc.chunk)
            else:
                lax.cond(sum(pids) % 2 == 0, write_whole, write_rows, value)

        if desc.sem:  # (the pl.when bodies below may return early: wait here)
            pl.semaphore_wait(scratch[sem_at], desc.sem)
        if desc.acc == "none":
            write(contrib.astype(odt))
            return
        k = pids[desc.reduce]
        if desc.acc == "out":
            @pl.when(k == 0)
            def _():
                write(jnp.zeros(vs, odt))

            write(o_ref[...] + contrib.astype(odt))
            return
        acc = scratch[acc_at]

        @pl.when(k == 0)
        def _():
            acc[...] = jnp.zeros(vs, adt)

        acc[...] += contrib.astype(adt)

        @pl.when(k == pl.num_programs(desc.reduce) - 1)
        def _():
            write(acc[...].astype(odt))

    in_specs = []
    for ti, t in enumerate(desc.terms):
        for spec in specs[ti]:
            if t.kind in ("dma", "pipeline"):
                in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
            elif t.kind == "vmem":
                in_specs.append(pl.BlockSpec(memory_space=pltpu.VMEM))
            elif t.kind == "smem":
                in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
            else:
                in_specs.append(pl.BlockSpec(_block_shape(spec.block),
                                             _index_map(spec.index, rank)))
    out_specs, out_shapes = [], []
    for i, out in enumerate(output_arrays(desc)):
        if i == 1 and desc.side == "dma":
            out_specs.append(pl.BlockSpec(memory_space=pl.ANY))
        else:
            out_specs.append(pl.BlockSpec(_block_shape(out.block),
                                          _index_map(out.index, rank)))
        out_shapes.append(jax.ShapeDtypeStruct(out.shape, odt))
    params = pltpu.CompilerParams(dimension_semantics=desc.semantics)
    aliases = {nt + first[desc.alias]: 0} if desc.alias >= 0 else {}

    def fn(*args, interpret: Any = False):
        if nt:
            grid_spec = pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=nt, grid=desc.grid, in_specs=in_specs,
                out_specs=out_specs, scratch_shapes=scratch_shapes)
            call = pl.pallas_call(kernel, grid_spec=grid_spec, out_shape=out_shapes,
                                  compiler_params=params, input_output_aliases=aliases,
                                  interpret=interpret)
        else:
            call = pl.pallas_call(kernel, grid=desc.grid, in_specs=in_specs,
                                  out_specs=out_specs, out_shape=out_shapes,
                                  scratch_shapes=scratch_shapes, compiler_params=params,
                                  input_output_aliases=aliases, interpret=interpret)
        if desc.wrap == "jit":
            return jax.jit(lambda *a: call(*a))(*args)
        if desc.wrap == "vmap":
            tables = args[:nt]
            return jax.vmap(lambda *a: call(*tables, *a))(*args[nt:])
        if desc.wrap == "vmap_all":
            return jax.vmap(lambda *a: call(*a))(*args)
        return call(*args)

    return fn


def output_arrays(desc: Kernel) -> list[ArraySpec]:
    """The output, then the side output (term 0's value, maybe stored transposed)."""
    index = tuple(Index("axis", d.axis) if d.axis != -1 else Index("const")
                  for d in desc.out)
    block = tuple(d.block if d.axis != -1 else d.size for d in desc.out)
    shape = tuple(d.size for d in desc.out)
    out = [ArraySpec(shape, block, index)]
    if desc.side == "plain":
        out.append(out[0])
    elif desc.side == "dma":  # whole blocks: every DMA'd window lies inside the array
        whole = tuple(desc.grid[d.axis] * (d.block or 1) if d.axis != -1 else d.size
                      for d in desc.out)
        out.append(ArraySpec(whole, block, index))
    elif desc.side == "transposed":
        swap = lambda t: (*t[:-2], t[-1], t[-2])  # noqa: E731
        out.append(ArraySpec(swap(shape), swap(block), swap(index)))
    return out


# ---------------------------------------------------------------------------------------
# reference: the output by walking the grid on numpy blocks.


def _read_block(spec: ArraySpec, array: np.ndarray, pids: Sequence[int],
                tables: Sequence[np.ndarray]) -> np.ndarray:
    index, pad = [], []
    for b, ix, n in zip(spec.block, spec.index, array.shape):
        e = int(index_value(ix, pids, tables))
        if b == 0:
            assert 0 <= e < n, (spec, pids)
            index.append(e)
            continue
        lo, hi = e * b, min(e * b + b, n)
        assert 0 <= lo < n, (spec, pids)
        index.append(slice(lo, hi))
        pad.append((0, b - (hi - lo)))
    block = array[tuple(index)]
    if any(p for _, p in pad):  # an edge block: padding that only reaches padding
        fill = np.iinfo(block.dtype).max if block.dtype.kind in "iu" else np.nan
        block = np.pad(block, pad, constant_values=np.asarray(fill).astype(block.dtype))
    return block


def _write_block(array: np.ndarray, spec: ArraySpec, value: Any, pids: Sequence[int]
                 ) -> None:
    """Write the part of a block inside the array (squeezed dims are integer indices)."""
    index: list[Any] = []
    for b, ix in zip(spec.block, spec.index):
        e = int(index_value(ix, pids, ()))
        index.append(e if b == 0 else slice(e * b, e * b + b))
    valid = array[tuple(index)].shape
    array[tuple(index)] = np.asarray(value)[tuple(slice(0, n) for n in valid)]


def reference(desc: Kernel, tables: Sequence[np.ndarray], arrays: Sequence[np.ndarray]
              ) -> list[np.ndarray]:
    """The outputs (out, then the side output if any) by walking the grid."""
    if desc.wrap.startswith("vmap"):
        per = [reference(dataclasses.replace(desc, wrap="none"),
                         [t[b] for t in tables] if desc.wrap == "vmap_all" else tables,
                         [a[b] for a in arrays]) for b in range(2)]
        return [np.stack(outs) for outs in zip(*per)]
    specs = [term_arrays(desc, t) for t in desc.terms]
    first = _starts([len(s) for s in specs])
    odt, adt = desc.dtype, acc_dtype(desc)
    out_specs = output_arrays(desc)
    outs = [np.zeros(o.shape, jnp.dtype(odt)) for o in out_specs]
    block: Any = None  # the output block in VMEM (acc "out") or the scratch accumulator
    for point in np.ndindex(*desc.grid):
        pids = tuple(int(p) for p in point)
        values: dict[int, Any] = {}
        for ti, t in enumerate(desc.terms):
            if t.kind == "pipeline":
                spec = specs[ti][0]
                acc = jnp.zeros(value_shape(desc), odt)
                for inner in range(t.k):
                    at = dataclasses.replace(spec, index=(Index("const", offset=inner),
                                                          *spec.index[1:]))
                    acc = acc + _read_block(at, arrays[first[ti]], pids, tables)
                values[ti] = acc
                continue
            blocks = [_read_block(s, arrays[first[ti] + i], pids, tables)
                      for i, s in enumerate(specs[ti])]
            if t.kind == "dot":
                values[ti] = jnp.dot(blocks[0], blocks[1],
                                     preferred_element_type=jnp.float32).astype(odt)
            else:
                values[ti] = jnp.asarray(_t(blocks[0]) if t.transposed else blocks[0])
        if desc.side != "none":
            side = _t(values[0]) if desc.side == "transposed" else values[0]
            _write_block(outs[1], out_specs[1], np.asarray(side).astype(odt), pids)
        contrib = compute(desc, values, pids, in_kernel=False)
        if desc.acc == "none":
            result = contrib.astype(odt)
        else:
            k, last = pids[desc.reduce], desc.grid[desc.reduce] - 1
            if k == 0:
                block = jnp.zeros(value_shape(desc), odt if desc.acc == "out" else adt)
            block = block + contrib.astype(block.dtype)
            if desc.acc == "scratch" and k != last:
                continue
            result = block.astype(odt)
        _write_block(outs[0], out_specs[0], result, pids)
    return outs


# ---------------------------------------------------------------------------------------
# The strategy.


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def kernels(draw: Any, dma: bool = False) -> Kernel:
    """Valid kernels; with dma=True each has at least one input DMA'd from pl.ANY."""
    dtype = draw(st.sampled_from(DTYPES))
    floaty = dtype != I32
    reduce = draw(st.booleans())
    # A leading batch dim: walked squeezed, walked in blocks of 1 or 2, or taken whole.
    batch = draw(st.sampled_from(["none"] * 3 + ["squeezed", "blocked", "full"]))
    m_tiled = draw(st.booleans())
    n_tiled = draw(st.booleans())
    free = 3 - reduce - (batch in ("squeezed", "blocked"))  # grid rank <= 3
    if m_tiled and n_tiled and free < 2:
        n_tiled = False
    if free < 1:
        m_tiled = n_tiled = False

    # Output dims before edge blocks: [size, block (0: squeezed), walked].
    raw: list[list[int]] = []
    if batch == "squeezed":
        raw.append([draw(st.integers(1, 3)), 0, 1])
    elif batch == "blocked":
        b = draw(st.integers(1, 2))
        raw.append([b * draw(st.integers(1, 3)), b, 1])
    elif batch == "full":
        size = draw(st.integers(1, 3))
        raw.append([size, size, 0])
    if m_tiled:
        b = draw(st.sampled_from([8, 16, 32, 128]))
        raw.append([b * draw(st.integers(1, 3 if b < 128 else 2)), b, 1])
    else:
        size = draw(st.integers(1, 40))
        raw.append([size, size, 0])
    if n_tiled:
        b = draw(st.sampled_from([128, 256]))
        raw.append([b * draw(st.integers(1, 3 if b == 128 else 2)), b, 1])
    else:
        size = draw(st.integers(1, 300))
        raw.append([size, size, 0])
    walked = [i for i, r in enumerate(raw) if r[2]]
    perm = draw(st.permutations(range(len(walked))))  # which grid axis walks which dim
    axis_of = {d: perm[i] for i, d in enumerate(walked)}
    grid = [0] * len(walked)
    for d, a in axis_of.items():
        grid[a] = raw[d][0] // (raw[d][1] or 1)
    n_parallel = draw(st.integers(0, len(walked)))  # parallel axes: a prefix of the grid
    semantics = ["parallel"] * n_parallel + ["arbitrary"] * (len(walked) - n_parallel)
    red = -1
    if reduce:
        red = len(grid)
        grid.append(draw(st.integers(1, 3)))
        semantics.append("arbitrary")
    if not grid:  # nothing walked: a step repeated, rewriting the whole output
        grid.append(draw(st.integers(1, 3)))
        semantics.append("arbitrary")
    grid_t = tuple(grid)
    rank = len(grid_t)
    out0 = tuple(Dim(r[0], r[1], axis_of.get(d, -1)) for d, r in enumerate(raw))
    bm, bn = out0[-2].block, out0[-1].block
    can_t = out0[-2].axis == -1 or bm % 128 == 0  # M may be a lane dim (128k or full)
    tables: list[tuple[int, tuple[int, ...]]] = []

    def draw_index(od: Dim) -> Index:
        if od.axis == -1:
            return Index("const")
        kind = draw(st.sampled_from(["axis", "axis", "axis", "const", "prefetch"]))
        if kind == "axis":  # identity, another (transposed) grid axis, plus an offset
            a = od.axis if draw(st.integers(0, 2)) else draw(st.integers(0, rank - 1))
            return Index("axis", a, draw(st.sampled_from([0, 0, 1, 2])))
        if kind == "const":
            return Index("const", offset=draw(st.integers(0, 2)))
        a = draw(st.integers(0, rank - 1))
        reuse = [i for i, (ax, _) in enumerate(tables) if ax == a]
        if reuse and draw(st.booleans()):
            return Index("prefetch", a, table=reuse[0])
        nb = draw(st.integers(1, 4))
        values = draw(st.lists(st.integers(0, nb - 1), min_size=grid_t[a],
                               max_size=grid_t[a]))
        tables.append((a, tuple(values)))
        return Index("prefetch", a, table=len(tables) - 1)

    def draw_term(kind: str) -> Term:
        index = tuple(draw_index(od) for od in out0)
        if kind == "dot":
            k_split = reduce and draw(st.booleans())
            k = draw(st.sampled_from([128, 256])) if k_split else draw(st.integers(1, 160))
            return Term("dot", index, k=k, k_split=k_split)
        stacked = reduce and draw(st.booleans())
        extra = draw(st.sampled_from([0, 0, 0, 1]))
        if kind == "block":
            transposed = can_t and draw(st.booleans())
            r, c = (bn, bm) if transposed else (bm, bn)
            reads = ["whole", "whole", "rows"] + (["strided"] if r % 2 == 0 else []) + (
                ["at"] if r > 1 else []) + (["cols"] if c > 1 else [])
            read = draw(st.sampled_from(reads))
            chunk = {"rows": lambda: draw(st.sampled_from(_divisors(r))),
                     "at": lambda: draw(st.integers(1, r - 1)),
                     "cols": lambda: draw(st.integers(1, c - 1))}.get(read, lambda: 0)()
            return Term("block", index, transposed=transposed, stacked=stacked, extra=extra,
                        read=read, chunk=chunk)
        if kind == "vmem":
            return Term("vmem", index, stacked=stacked, extra=extra)
        if kind == "pipeline":
            return Term("pipeline", index, stacked=stacked, extra=extra,
                        k=draw(st.integers(1, 3)))
        mode = draw(st.sampled_from(["single", "loop", "split", "pipelined", "sync",
                                     "scoped"]))
        chunk = draw(st.sampled_from(_divisors(bm))) if mode in ("loop", "split") else 0
        return Term("dma", index, stacked=stacked, extra=extra, dma=mode, chunk=chunk)

    kinds = ["block", "block", "vmem"] + (["dot"] if floaty else []) + (
        ["dma", "dma", "pipeline"] if dma else [])
    n_terms = draw(st.integers(1, 3))
    terms = [draw_term(draw(st.sampled_from(kinds))) for _ in range(n_terms)]
    if dma and not any(t.kind == "dma" for t in terms):
        terms[draw(st.integers(0, n_terms - 1))] = draw_term("dma")

    binary = ["add", "sub", "mul", "max", "min", "select"] + ([] if floaty else ["and", "xor"])
    unary = ["neg", "abs", "square", "rowsum", "colsum", "pid", "fori", "smem", "roll0",
             "roll1"] + (
        ["tanh", "exp", "matmul"] if floaty else [])
    ops: list[Op] = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.sampled_from(binary + unary))
        if name in binary or name == "fori":
            arg = draw(st.integers(-1, n_terms - 1))
            const = draw(st.integers(1, 3)) if name == "fori" else draw(st.integers(-3, 3))
            ops.append(Op(name, arg, const))
        elif name == "matmul":
            terms.append(Term("weight"))
            ops.append(Op(name, len(terms) - 1))
        elif name == "smem":
            terms.append(Term("smem", k=draw(st.integers(1, 8))))
            ops.append(Op(name, len(terms) - 1))
        elif name in ("roll0", "roll1"):
            ops.append(Op(name, const=draw(st.integers(1, 300))))
        else:
            ops.append(Op(name, const=draw(st.integers(1, 3))))

    side = draw(st.sampled_from(["none", "none", "plain"] + (["transposed"] if can_t else [])
                                + (["dma"] if dma else [])))
    # Edge blocks, where no op mixes elements across the dim (padding stays in padding)
    # and no padding is DMA'd into the side output.
    names = {op.name for op in ops}
    out = list(out0)
    edges = [(len(out) - 2, MIXES_M), (len(out) - 1, MIXES_N)]
    if batch == "blocked" and out[0].block > 1:
        edges.append((0, set()))
    for d, mixes in edges:
        od = out[d]
        if (od.axis != -1 and not (names & mixes) and side != "dma"
                and draw(st.integers(0, 2)) == 0):
            out[d] = dataclasses.replace(od, size=od.size - draw(st.integers(1, od.block - 1)))

    if any(t.dma == "pipelined" for t in terms):  # state carried across grid steps
        semantics = ["arbitrary"] * len(semantics)
    acc = draw(st.sampled_from(["out", "scratch"])) if reduce else "none"
    store = draw(st.sampled_from(["whole", "rows", "cond", "masked"]))
    chunk = draw(st.sampled_from(_divisors(bm))) if store != "whole" else 0
    wrap = draw(st.sampled_from(["none", "none", "jit", "vmap", "vmap_all"]))
    # The output may alias the input of a block term read at the output's own block.
    identity = tuple(Index("axis", d.axis) if d.axis != -1 else Index("const") for d in out)
    can_alias = [i for i, t in enumerate(terms[:n_terms])
                 if t.kind == "block" and t.index == identity and not t.transposed
                 and not t.stacked and not t.extra]
    alias = draw(st.sampled_from([-1, -1] + can_alias))
    sem = draw(st.sampled_from([0, 0, 0, 1, 3]))
    return Kernel(dtype, grid_t, tuple(semantics), tuple(out), red, tuple(tables),
                  tuple(terms), tuple(ops), acc, store, chunk,
                  draw(st.integers(0, 2**16)), side, wrap, alias, sem)
