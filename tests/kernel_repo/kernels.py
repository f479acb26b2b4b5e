"""A small TPU kernel library, written the way kernel repositories write their wrappers:
each asks which chip it runs on before its kernel runs (pallas-check's proof that a TPU-only
suite runs green on a CPU under `pytest --pallas-check --pallas-check-tpu v6e`; see
tests/api/test_tpu_suite.py).

- `scale_rows` picks its block rows from `jax.devices()[0].device_kind`, as JAX's own
  ragged paged attention picks its tuned block sizes (`get_tpu_version`);
- `double_per_core` builds `pltpu.create_tensorcore_mesh("core")` without `num_cores` (the
  device's `num_cores`) and splits the rows over the chip's TensorCores;
- `add_tiled` sizes its blocks from `pltpu.get_tpu_info()`: lanes and sublanes, and as many
  rows as a quarter of the chip's VMEM holds for its double-buffered blocks;
- `scale_tokens` runs over a token buffer padded to whole blocks, writes only the blocks
  that hold tokens, and hands its caller `out[:num_tokens]` (the padding rows it never
  wrote are dropped inside the jitted wrapper: no defect);
- `append_tokens` is a decode step's KV-cache append, jitted with the cache donated (as
  ragged paged attention's wrappers donate theirs): a first kernel writes a metadata
  schedule, each live sequence's cache row, only for the `num_seqs` live sequences (the
  rest of the schedule is never written), and a second kernel, its one consumer, reads
  only that prefix and copies each new row into the donated cache in place (no defect:
  the re-run that proves the unwritten tail reaches nothing runs on a copy of the
  donated cache); `append_tokens_bug` is its twin whose consumer loops one sequence too
  far: the schedule's first unwritten entry (clamped into the cache) decides which cache
  row the extra copy overwrites, so the unwritten rows reach the cache the step returns;
- `scale_rows_gpu_params` is `scale_rows` as ported from the GPU, Triton's compiler params
  left on: a TPU refuses it (its lowering asserts the params are Mosaic's), and the suite
  asserts that refusal (`pytest.raises(AssertionError)`).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def tpu_version() -> int:
    """The TPU generation from the device kind as libtpu spells it ("TPU v5 lite",
    "TPU v5", "TPU v6 lite", "TPU7x"); a device that is no TPU is refused."""
    kind = jax.devices()[0].device_kind
    if "TPU" not in kind:
        raise RuntimeError(f"these kernels need a TPU, not {kind!r}")
    if kind.startswith("TPU7"):
        return 7
    return int(kind.removeprefix("TPU v").split()[0].rstrip("ep"))


def block_rows() -> int:
    """Tuned per generation: v6 and later take 16 rows a step, older chips 8."""
    return 16 if tpu_version() >= 6 else 8


def scale_rows(x: jax.Array, factor: float) -> jax.Array:
    rows = block_rows()

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * factor

    spec = pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(kernel, grid=(x.shape[0] // rows,), in_specs=[spec],
                          out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def scale_rows_gpu_params(x: jax.Array, factor: float) -> jax.Array:
    from jax.experimental.pallas import triton as pltriton

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * factor

    spec = pl.BlockSpec((block_rows(), x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(kernel, grid=(x.shape[0] // block_rows(),), in_specs=[spec],
                          out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          compiler_params=pltriton.CompilerParams(num_warps=4))(x)


def double_per_core(x: jax.Array) -> jax.Array:
    """2 * x, each TensorCore of the chip doubling its own share of the rows through VMEM."""
    mesh = pltpu.create_tensorcore_mesh("core")
    share = x.shape[0] // mesh.shape["core"]

    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh,
               scratch_types=[pltpu.VMEM((share, x.shape[1]), x.dtype)])
    def kernel(x_hbm, o_hbm, buf):
        rows = pl.ds(jax.lax.axis_index("core") * share, share)
        pltpu.sync_copy(x_hbm.at[rows], buf)
        buf[...] = buf[...] * 2
        pltpu.sync_copy(buf, o_hbm.at[rows])

    return kernel(x)


def add_tiles(rows: int, itemsize: int) -> int:
    """Block rows for `add_tiled`: a multiple of the sublanes, at most `rows`, with three
    double-buffered (rows, lanes) blocks in a quarter of the chip's VMEM."""
    info = pltpu.get_tpu_info()
    fit = info.vmem_capacity_bytes // 4 // (3 * 2 * info.num_lanes * itemsize)
    tile = min(rows, fit, 64)
    return max(info.num_sublanes, tile - tile % info.num_sublanes)


def add_tiled(x: jax.Array, y: jax.Array) -> jax.Array:
    info = pltpu.get_tpu_info()
    tile = add_tiles(x.shape[0], x.dtype.itemsize)

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((tile, info.num_lanes), lambda i, j: (i, j))
    return pl.pallas_call(
        kernel, grid=(x.shape[0] // tile, x.shape[1] // info.num_lanes),
        in_specs=[spec, spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel")))(x, y)


@functools.partial(jax.jit, static_argnums=(1, 2))
def scale_tokens(tokens: jax.Array, num_tokens: int, factor: float) -> jax.Array:
    """`factor * tokens[:num_tokens]`, through a kernel over the padded buffer that skips
    the blocks past the last token (their output rows are never written)."""
    rows = block_rows()
    padded = -(-tokens.shape[0] // rows) * rows
    x = jnp.pad(tokens, ((0, padded - tokens.shape[0]), (0, 0)))
    used = -(-num_tokens // rows)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * factor

    spec = pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))
    out = pl.pallas_call(kernel, grid=(used,), in_specs=[spec], out_specs=spec,
                         out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    return out[:num_tokens]


def matmul(x: jax.Array, y: jax.Array, precision: object = None) -> jax.Array:
    """x @ y in blocks of 64 rows, float32 out, at the product precision asked."""
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=precision,
                             preferred_element_type=jnp.float32)

    rows = 64
    return pl.pallas_call(
        kernel, grid=(x.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)),
                  pl.BlockSpec(y.shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((rows, y.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32))(x, y)


MAX_SEQS = 8  # sequences a decode step serves at most
SEQ_ROWS = 16  # cache rows each sequence owns


def _schedule_kernel(num_ref, lens_ref, slots_ref):
    """slots[i]: the cache row sequence i's new token goes to, for the live sequences only
    (the entries past `num_seqs` are never written: nothing reads them)."""
    def body(i, carry):
        slots_ref[i] = i * SEQ_ROWS + lens_ref[i]
        return carry

    jax.lax.fori_loop(0, num_ref[0], body, 0)


def _append_kernel(extra, num_ref, slots_ref, new_hbm, cache_hbm, out_hbm, sem):
    del cache_hbm  # aliased to out_hbm: the cache is updated in place
    last = out_hbm.shape[0] - 1

    def body(i, carry):
        row = jnp.minimum(slots_ref[i], last)  # never past the cache
        copy = pltpu.make_async_copy(new_hbm.at[pl.ds(i, 1)], out_hbm.at[pl.ds(row, 1)], sem)
        copy.start()
        copy.wait()
        return carry

    jax.lax.fori_loop(0, num_ref[0] + extra, body, 0)


def _append(cache, new, lens, num_seqs, extra):
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    slots = pl.pallas_call(
        _schedule_kernel, in_specs=[smem, smem], out_specs=smem,
        out_shape=jax.ShapeDtypeStruct((MAX_SEQS,), jnp.int32))(num_seqs, lens)
    cache = pl.pallas_call(
        functools.partial(_append_kernel, extra),
        in_specs=[smem, smem, hbm, hbm], out_specs=hbm,
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        input_output_aliases={3: 0})(num_seqs, slots, new, cache)
    live = jnp.arange(MAX_SEQS) < num_seqs[0]
    return cache, lens + live.astype(lens.dtype)


@functools.partial(jax.jit, donate_argnums=0)
def append_tokens(cache: jax.Array, new: jax.Array, lens: jax.Array, num_seqs: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """One decode step: sequence i < num_seqs[0] appends row new[i] to its cache rows
    (i * SEQ_ROWS + lens[i]); returns the cache (updated in place: donated) and the new
    lengths."""
    return _append(cache, new, lens, num_seqs, 0)


@functools.partial(jax.jit, donate_argnums=0)
def append_tokens_bug(cache: jax.Array, new: jax.Array, lens: jax.Array, num_seqs: jax.Array
                      ) -> tuple[jax.Array, jax.Array]:
    """`append_tokens` with its consumer looping over num_seqs + 1 sequences: BUG, it reads
    the schedule's first entry that was never written."""
    return _append(cache, new, lens, num_seqs, 1)
