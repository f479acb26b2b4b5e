"""DMAs whose slices have traced sizes (issue #25, items 1 and 10).

A DMA moves and signals exactly the bytes of its actual slice; a wait takes off the bytes
of the descriptor it is given, evaluated with the same traced sizes; a zero-length DMA
moves and signals nothing. BlockSpec dimensions `pl.Element` / `pl.BoundedSlice` are the
same thing written as blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from scenarios.test_samples import SAMPLES, _describe, _matches, _run, expectations


@pytest.mark.parametrize("args", ["--dma on_wait --races", "--dma eager",
                                  "--dma random --schedules 20 --races"])
def test_dynamic_dma_ok_is_clean_in_every_dma_mode(cli, args):
    result = _run(cli, SAMPLES / "dynamic_dma_ok.py", args)
    assert result.findings == [], _describe(result.findings)
    assert result.exit_code == 0
    assert "output matches" in result.output


@pytest.mark.parametrize("mode", ["on_wait", "eager", "random"])
def test_dynamic_dma_bug_deadlocks_in_every_dma_mode(cli, mode):
    path = SAMPLES / "dynamic_dma_bug.py"
    (want,) = expectations(path)
    result = _run(cli, path, f"--dma {mode}")
    assert result.exit_code == 1
    assert [f["kind"] for f in result.findings] == ["deadlock"], _describe(result.findings)
    assert any(_matches(f, want, path) for f in result.findings), _describe(result.findings)
    assert "reach 32768 (it is 0)" in result.findings[0]["message"]


def _loop_wait_kernel(lens_ref, x_hbm, o_ref, buf, sem):
    """Two copies of lens[0] and lens[1] rows on one semaphore, started and then waited
    in pl.loops with the same traced sizes (`pl.ds(0, n)`)."""
    buf[...] = jnp.zeros_like(buf)

    @pl.loop(0, 2)
    def _(i):
        rows = pl.ds(0, lens_ref[i])
        pltpu.make_async_copy(x_hbm.at[rows], buf.at[rows], sem).start()

    @pl.loop(0, 2)
    def _(i):
        rows = pl.ds(0, lens_ref[i])
        pltpu.make_async_copy(x_hbm.at[rows], buf.at[rows], sem).wait()

    o_ref[...] = buf[...]


def _loop_wait(lens, x):
    return pl.pallas_call(
        _loop_wait_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 8, 128), lambda i, *_: (0, 0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA]),
        out_shape=jax.ShapeDtypeStruct((8, 8, 128), jnp.float32))(lens, x)


@pytest.mark.parametrize("mode", list(DmaMode))
@pytest.mark.parametrize("lens", [(6, 2), (2, 6), (0, 3), (0, 0)])
def test_wait_in_a_loop_takes_each_iterations_size(check, mode, lens):
    """The issue's case: sizes 6 then 2 deadlocked (the wait kept its first size). Races
    off: the two copies overlap in flight (rows 0:min(lens) written by both at once, the
    same values), a write-write race the race checker rightly reports; sizes are the
    subject here."""
    x = jnp.arange(8 * 8 * 128, dtype=jnp.float32).reshape(8, 8, 128) + 1
    result = check(_loop_wait, np.array(lens, np.int32), x,
                   config=Config(dma_mode=mode, races=False))
    assert result.findings == []
    want = np.zeros((8, 8, 128), np.float32)
    want[:max(lens)] = np.asarray(x)[:max(lens)]
    np.testing.assert_array_equal(np.asarray(result.value), want)


# -- pl.Element(n, padding=...) blocks of a pallas_call ----------------------------------

def _causal_sum_kernel(masked, x_ref, o_ref):
    """out[r] = x[r] + x[r-1] + x[r-2] (x is 0 before row 0): the block holds the 8 rows
    before the step's own 8, the first step's in the low padding (undefined values)."""
    i = pl.program_id(0)
    block = x_ref[...]
    if masked:
        rows = 8 * i - 8 + jax.lax.broadcasted_iota(jnp.int32, block.shape, 0)
        block = jnp.where(rows >= 0, block, 0.0)
    o_ref[...] = block[8:16] + block[7:15] + block[6:14]


def _causal_sum(x, masked=True):
    import functools
    return pl.pallas_call(
        functools.partial(_causal_sum_kernel, masked),
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((pl.Element(16, padding=(8, 0)), pl.Element(128)),
                               lambda i: (i * 8, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _causal_sum_reference(x: np.ndarray) -> np.ndarray:
    padded = np.concatenate([np.zeros((2, x.shape[1]), x.dtype), x])
    return padded[2:] + padded[1:-1] + padded[:-2]


@pytest.mark.parametrize("mode", list(DmaMode))
def test_element_block_with_padding(check, mode):
    """`pl.Element(16, padding=(8, 0))`: the index map's element offset counts in the
    padded array; the padding is never-written memory, masked away here (clean)."""
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128) % 7 + 1
    result = check(_causal_sum, x, config=Config(dma_mode=mode))
    assert result.findings == []
    np.testing.assert_array_equal(np.asarray(result.value), _causal_sum_reference(np.asarray(x)))


def test_element_padding_read_unmasked_is_uninitialized(check):
    """The same kernel using the padding's values: its first block's rows 0..2 depend on
    them (the padding is undefined on a TPU)."""
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128) % 7 + 1
    result = check(_causal_sum, x, False)
    assert result.kinds() == ["uninitialized"], result.findings
    (finding,) = result.findings
    assert finding.buffer == "x_ref"
    assert finding.details["output_range"] == [[0, 2], [0, 128]]


@pytest.mark.parametrize("start, ok", [(-1, False), (0, True), (24, True), (25, False)])
def test_element_block_may_reach_its_padding_only(check, start, ok):
    """An Element block's element offset may select padding, not what lies beyond it."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

    def call(x):
        return pl.pallas_call(
            kernel, grid=(1,),
            in_specs=[pl.BlockSpec((pl.Element(16, padding=(8, 0)), pl.Element(128)),
                                   lambda i: (start, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)

    result = check(call, jnp.ones((32, 128), jnp.float32))
    if ok:
        assert result.findings == []
    else:
        assert result.kinds() == ["out-of-bounds"], result.findings
        assert result.findings[0].buffer == "x_ref"
        assert result.findings[0].index_range == ((start - 8, start + 8), (0, 128))


# -- pl.BoundedSlice blocks of pltpu.emit_pipeline (JAX's dynamic-block pipelining) ------

_BLOCK, _ROWS = 8, 40
_SEQ_LENS = np.array([20, 37, 0], np.int32)  # valid rows per sequence; the last is padding


def _dynamic_block_kernel(lens_ref, x_hbm, o_hbm):
    """Each sequence b doubles its first lens[b] rows in blocks of up to 8 rows: the index
    map returns a pl.ds whose traced size is bounded by the BoundedSlice (the last block
    of a sequence is short; a sequence of length 0 has no blocks)."""
    b = pl.program_id(0)
    n = lens_ref[b]

    def index_map(i):
        start = i * _BLOCK
        return (pl.ds(start, jnp.minimum(_BLOCK, n - start)), 0)

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    spec = pl.BlockSpec((pl.BoundedSlice(_BLOCK), 128), index_map)
    pltpu.emit_pipeline(body, grid=(pl.cdiv(n, _BLOCK),), in_specs=[spec],
                        out_specs=[spec])(x_hbm.at[b], o_hbm.at[b])


def _dynamic_block(lens, x):
    return pl.pallas_call(
        _dynamic_block_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(len(_SEQ_LENS),),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={1: 0})(lens, x)


@pytest.mark.parametrize("mode", list(DmaMode))
def test_emit_pipeline_bounded_slice_blocks(check, mode):
    x = jnp.arange(len(_SEQ_LENS) * _ROWS * 128, dtype=jnp.float32).reshape(-1, _ROWS, 128)
    result = check(jax.jit(_dynamic_block), _SEQ_LENS, x,
                   config=Config(dma_mode=mode, races=True))
    assert result.findings == []
    want = np.asarray(x).copy()
    for b, n in enumerate(_SEQ_LENS):
        want[b, :n] *= 2
    np.testing.assert_array_equal(np.asarray(result.value), want)


# -- sizes and indices read from never-written memory (item 10) -----------------------

_NEVER_WRITTEN_SIZE = '''
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

def kernel(x_hbm, o_ref, lens_smem, buf, sem):
    n = lens_smem[0]  # never written: SMEM holds the int32 maximum
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]

def f(x):
    return pl.pallas_call(kernel, grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 8, 128), lambda i: (0, 0, 0)),
        scratch_shapes=[pltpu.SMEM((4,), jnp.int32), pltpu.VMEM((8, 8, 128), jnp.float32),
                        pltpu.SemaphoreType.DMA],
        out_shape=jax.ShapeDtypeStruct((8, 8, 128), jnp.float32))(x)

jax.block_until_ready(jax.jit(f)(jnp.ones((8, 8, 128), jnp.float32)))
'''


@pytest.mark.parametrize("mode", ["on_wait", "random"])
def test_dma_size_from_never_written_smem(tmp_path, mode):
    """A DMA of pl.ds(0, n), n from never-written SMEM (2**31 - 1 rows): before, the engine
    allocated index arrays of 2**31 elements (MemoryError, exit 4 under a cap; OOM-killed
    without). Now: out-of-bounds for the DMA, uninitialized naming the read of n and its
    line, exit 1, nothing allocated with the size (run under a 6 GB address-space cap)."""
    import json
    import subprocess
    import sys

    script = tmp_path / "size_from_smem.py"
    script.write_text(_NEVER_WRITTEN_SIZE)
    report = tmp_path / "report.json"
    # The cap is set by the child itself before JAX starts (no preexec_fn: this process
    # runs JAX's threads, and fork with threads may hang).
    capped = ("import resource, runpy, sys; cap = 6 * 2**30;"
              " resource.setrlimit(resource.RLIMIT_AS, (cap, cap));"
              " sys.argv = ['pallas-check', *sys.argv[1:]];"
              " runpy.run_module('pallas_check', run_name='__main__')")
    proc = subprocess.run(
        [sys.executable, "-c", capped, "run", "--format", "json", "-o", str(report),
         "--dma", mode, str(script)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    findings = json.loads(report.read_text())["findings"]
    got = sorted((f["kind"], f["buffer"], f["frames"][0]["line"]) for f in findings)
    assert got == [("out-of-bounds", "buf", 9), ("out-of-bounds", "x_hbm", 9),
                   ("uninitialized", "lens_smem", 7)], findings
    oob = next(f for f in findings if f["buffer"] == "x_hbm")
    assert oob["index_range"] == [[0, 2**31 - 1], [0, 8], [0, 128]]
    uninit = next(f for f in findings if f["kind"] == "uninitialized")
    assert uninit["index_range"] == [[0, 1]]
    assert "the DMA at " in uninit["message"] and "size_from_smem.py:9" in uninit["message"]


def test_dma_index_from_never_written_smem(check, table_call):
    """A DMA whose start is read from never-written SMEM: out of bounds (the int32
    maximum), and its data, the fill there, reaches the output: uninitialized names the
    read of the index."""
    def kernel(table_ref, x_hbm, o_ref, idx_smem, sem):
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(idx_smem[0], 8)], o_ref, sem)
        copy.start()
        copy.wait()

    call = table_call(kernel, 8, [pltpu.SMEM((2,), jnp.int32), pltpu.SemaphoreType.DMA])
    result = check(call, jnp.zeros((1,), jnp.int32), jnp.ones((16, 128), jnp.float32))
    assert sorted(result.kinds()) == ["out-of-bounds", "uninitialized"], result.findings
    uninit = next(f for f in result.findings if f.kind.value == "uninitialized")
    assert uninit.buffer == "idx_smem" and uninit.index_range == ((0, 1),)


# -- pl.BoundedSlice blocks of a pallas_call -------------------------------------------

_B_STARTS = np.array([0, 8, 20, 30], np.int32)
_B_LENS = np.array([8, 5, 0, 2], np.int32)  # step 2 selects nothing


def _bounded_in_kernel(masked, starts_ref, lens_ref, x_ref, o_ref):
    """Step i doubles rows [starts[i], starts[i] + lens[i]) of x into output block i; the
    input block's rows past lens[i] are undefined (never written)."""
    i = pl.program_id(0)
    rows = jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 0)
    o_ref[...] = (jnp.where(rows < lens_ref[i], x_ref[...] * 2, 0.0) if masked
                  else x_ref[...] * 2)


def _bounded_in(starts, lens, x, masked=True):
    import functools
    spec = pl.BlockSpec((pl.BoundedSlice(8), 128), lambda i, s, n: (pl.ds(s[i], n[i]), 0))
    return pl.pallas_call(
        functools.partial(_bounded_in_kernel, masked),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(len(starts),), in_specs=[spec],
            out_specs=pl.BlockSpec((8, 128), lambda i, s, n: (i, 0))),
        out_shape=jax.ShapeDtypeStruct((8 * len(starts), 128), jnp.float32))(starts, lens, x)


@pytest.mark.parametrize("mode", list(DmaMode))
def test_bounded_slice_input_blocks(check, mode):
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    result = check(_bounded_in, _B_STARTS, _B_LENS, x, config=Config(dma_mode=mode))
    assert result.findings == []
    want = np.zeros((32, 128), np.float32)
    for i, (s, n) in enumerate(zip(_B_STARTS, _B_LENS)):
        want[8 * i:8 * i + n] = 2 * np.asarray(x)[s:s + n]
    np.testing.assert_array_equal(np.asarray(result.value), want)


def test_bounded_slice_rows_past_the_size_are_undefined(check):
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    result = check(_bounded_in, _B_STARTS, _B_LENS, x, False)
    assert result.kinds() == ["uninitialized"], result.findings
    assert result.findings[0].buffer == "x_ref"
    assert result.findings[0].details["output_range"] == [[13, 32], [0, 128]]


def test_bounded_slice_output_blocks_write_their_slice_only(check):
    """Output block i is written back to rows [starts[i], starts[i] + lens[i]) only; the
    output aliases x, so the other rows keep x's values."""
    def kernel(starts_ref, lens_ref, x_ref, o_ref):
        o_ref[...] = jnp.full(o_ref.shape, pl.program_id(0) + 1, jnp.float32)

    def call(starts, lens, x):
        spec = pl.BlockSpec((pl.BoundedSlice(8), 128), lambda i, s, n: (pl.ds(s[i], n[i]), 0))
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=(4,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=spec),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            input_output_aliases={2: 0})(starts, lens, x)

    x = -jnp.ones((32, 128), jnp.float32)
    result = check(call, _B_STARTS, _B_LENS, x)
    assert result.findings == []
    want = -np.ones((32, 128), np.float32)
    for i, (s, n) in enumerate(zip(_B_STARTS, _B_LENS)):
        want[s:s + n] = i + 1
    np.testing.assert_array_equal(np.asarray(result.value), want)


@pytest.mark.parametrize("start, size", [(28, 8), (0, 9), (-1, 2)])
def test_bounded_slice_outside_its_array_or_block(check, start, size):
    """A slice past the array, or larger than the BoundedSlice's block, is out of bounds."""
    x = jnp.ones((32, 128), jnp.float32)
    result = check(_bounded_in, np.array([start], np.int32), np.array([size], np.int32), x)
    assert "out-of-bounds" in result.kinds(), result.findings
    oob = next(f for f in result.findings if f.kind.value == "out-of-bounds")
    assert oob.buffer == "x_ref" and oob.index_range == ((start, start + size), (0, 128))
    assert f"block index (pl.ds({start}, {size}), 0) of x_ref" in oob.message
