"""The explicit MXU operations simulated (engine/rules/mxu.py, issue 54 item 5): staged
RHSs, loads, accumulation across operations and addresses, pops that zero, the products'
rounding, and the misuses JAX forbids that the compiler does not see, as `mxu-misuse`
findings at the operation's line.

The semantics are JAX 0.10.2's statement of the operations and libtpu 0.0.42's geometry for
v7x; which accumulator address holds which tile, and the rounding of float32 operands, are
pallas-check's reading, not checked on a chip.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config
from pallas_check.engine.rules.mxu import from_tiles, product, to_tiles

V7X = Config(tpu="v7x")
RNG = np.random.default_rng(54)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _line(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    [hit] = [first + k for k, line in enumerate(lines) if text in line]
    return hit


# -- the values ------------------------------------------------------------------------------

def test_float32_operands_are_rounded_to_bfloat16_only_in_the_chips_arithmetic():
    lhs, rhs = _f32(8, 256), _f32(256, 256)
    exact = lhs.astype(np.float64) @ rhs.astype(np.float64)
    rounded = (lhs.astype(ml_dtypes.bfloat16).astype(np.float64)
               @ rhs.astype(ml_dtypes.bfloat16).astype(np.float64))
    got_exact, got_rounded = product(lhs, rhs, False), product(lhs, rhs, True)
    assert got_exact.dtype == got_rounded.dtype == np.float32
    np.testing.assert_array_equal(got_exact, exact.astype(np.float32))
    np.testing.assert_array_equal(got_rounded, rounded.astype(np.float32))
    assert np.abs(got_rounded - got_exact).max() > 1e-2  # the rounding shows


def test_bfloat16_and_float8_operands_are_exact_either_way():
    lhs = _f32(16, 256).astype(ml_dtypes.bfloat16)
    rhs = _f32(256, 256).astype(ml_dtypes.float8_e4m3fn)
    want = (lhs.astype(np.float64) @ rhs.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(product(lhs, rhs, True), want)
    np.testing.assert_array_equal(product(lhs, rhs, False), want)


def test_a_result_is_held_rows_first_two_addresses_per_eight_rows():
    result = np.arange(24 * 256, dtype=np.float32).reshape(24, 256)
    tiles = to_tiles(result)
    assert tiles.shape == (6, 8, 128)
    for address in range(6):
        group, half = divmod(address, 2)
        np.testing.assert_array_equal(
            tiles[address], result[8 * group:8 * group + 8, 128 * half:128 * half + 128])
    np.testing.assert_array_equal(from_tiles(tiles, 24), result)


# -- in a kernel -------------------------------------------------------------------------------

def _accumulate_kernel(x_ref, w_ref, v_ref, o_ref, p_ref):
    """Two products added at address 4 of MXU 1 (the second reusing the loaded RHS), one
    with a transposed push at address 0 of MXU 0, popped in parts."""
    pltpu.matmul_push_rhs(w_ref[...], staging_register=1, mxu_index=1)
    pltpu.matmul_push_rhs(v_ref[...], staging_register=0, mxu_index=0, transpose=True)
    pltpu.matmul_acc_lhs(4, x_ref[0], mxu_index=1, load_staged_rhs=1)
    pltpu.matmul_acc_lhs(4, x_ref[1], mxu_index=1)
    pltpu.matmul_acc_lhs(0, x_ref[0], mxu_index=0, load_staged_rhs=0)
    o_ref[...] = pltpu.matmul_pop(4, (16, 256), jnp.float32, 1)
    # MXU 0: rows 8-15 from address 2, then rows 0-7 from address 0 (rows first).
    p_ref[8:16, :] = pltpu.matmul_pop(2, (8, 256), jnp.float32, 0)
    p_ref[0:8, :] = pltpu.matmul_pop(0, (8, 256), jnp.float32, 0)


def _accumulate(x, w, v):
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    out = jax.ShapeDtypeStruct((16, 256), jnp.float32)
    return pl.pallas_call(_accumulate_kernel, in_specs=[vmem] * 3, out_specs=[vmem] * 2,
                          out_shape=[out, out])(x, w, v)


@pytest.mark.parametrize("chip", [False, True], ids=["exact", "chip-arithmetic"])
def test_accumulate_reuse_transpose_and_pop_in_parts(check, chip):
    x, w, v = _f32(2, 16, 256), _f32(256, 256), _f32(256, 256)
    r = check(_accumulate, x, w, v, config=Config(tpu="v7x", chip_arithmetic=chip))
    assert r.session.findings == [] and r.session.engine_error is None
    summed, transposed = (np.asarray(o) for o in r.value)

    def mxu(a, b):  # each product rounded to float32 as the MXU leaves it
        return product(a, b, chip)

    want = (mxu(x[0], w) + mxu(x[1], w)).astype(np.float32)
    np.testing.assert_array_equal(summed, want)
    np.testing.assert_array_equal(transposed, mxu(x[0], v.T))
    np.testing.assert_allclose(summed, x[0] @ w + x[1] @ w, rtol=1e-2 if chip else 1e-5,
                               atol=0.5 if chip else 1e-3)


def _grid_kernel(x_ref, w_ref, o_ref):
    """Two grid steps on one core: the accumulator and the loaded RHS persist between them."""
    k = pl.program_id(0)

    @pl.when(k == 0)
    def _():
        pltpu.matmul_push_rhs(w_ref[...], staging_register=0, mxu_index=0)
        pltpu.matmul_acc_lhs(0, x_ref[...], mxu_index=0, load_staged_rhs=0)

    @pl.when(k == 1)
    def _():
        pltpu.matmul_acc_lhs(0, x_ref[...], mxu_index=0)
        o_ref[...] = pltpu.matmul_pop(0, (8, 256), jnp.float32, 0)


def test_the_mxu_persists_across_grid_steps(check):
    x, w = _f32(8, 512), _f32(256, 256)
    call = pl.pallas_call(
        _grid_kernel, grid=(2,),
        in_specs=[pl.BlockSpec((8, 256), lambda k: (0, k)),
                  pl.BlockSpec((256, 256), lambda k: (0, 0))],
        out_specs=pl.BlockSpec((8, 256), lambda k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32))
    r = check(call, x, w, config=V7X)
    assert r.session.findings == []
    want = product(x[:, :256], w, False) + product(x[:, 256:], w, False)
    np.testing.assert_array_equal(np.asarray(r.value), want)


# -- misuses -------------------------------------------------------------------------------------

def _misuses(session):
    """The findings as (kind, buffer, line, range), in line order (the report's)."""
    return sorted((f.kind.value, f.buffer, f.frames[0].line, f.index_range)
                  for f in session.findings)


def _pushed_twice(x_ref, w_ref, o_ref):
    def body(i, carry):
        pltpu.matmul_push_rhs(w_ref[...], staging_register=0, mxu_index=0)  # twice
        return carry

    jax.lax.fori_loop(0, 2, body, 0)  # the compiler does not see it in a loop
    pltpu.matmul_acc_lhs(0, x_ref[...], mxu_index=0, load_staged_rhs=0)
    o_ref[...] = pltpu.matmul_pop(0, (8, 256), jnp.float32, 0)


def _other_mxu(x_ref, w_ref, o_ref):
    pltpu.matmul_push_rhs(w_ref[...], staging_register=0, mxu_index=0)  # pushed to MXU 0
    pltpu.matmul_acc_lhs(0, x_ref[...], mxu_index=1, load_staged_rhs=0)  # loaded on MXU 1
    o_ref[...] = pltpu.matmul_pop(0, (8, 256), jnp.float32, 1)


def _no_rhs(x_ref, w_ref, o_ref):
    pltpu.matmul_acc_lhs(0, x_ref[...], mxu_index=0)  # nothing loaded
    o_ref[...] = pltpu.matmul_pop(0, (8, 256), jnp.float32, 0)


def _half_popped(x_ref, w_ref, o_ref):
    pltpu.matmul_push_rhs(w_ref[...], staging_register=0, mxu_index=0)
    pltpu.matmul_acc_lhs(6, jnp.concatenate([x_ref[...]] * 3), mxu_index=0,  # 24 rows
                         load_staged_rhs=0)
    o_ref[...] = pltpu.matmul_pop(6, (8, 256), jnp.float32, 0)  # rows 0-7 only


def _single(kernel):
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    return pl.pallas_call(kernel, in_specs=[vmem, vmem], out_specs=vmem,
                          out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32))


def test_a_push_into_a_full_register_is_reported_and_the_newer_rhs_kept(check):
    x, w = _f32(8, 256), _f32(256, 256)
    r = check(_single(_pushed_twice), x, w, config=V7X)
    line = _line(_pushed_twice, "# twice")
    assert _misuses(r.session) == [("mxu-misuse", "MXU 0 staging register 0", line, None)]
    [finding] = r.session.findings
    assert "still holds the RHS pushed" in finding.message
    assert f"test_mxu.py:{line}" in finding.message
    np.testing.assert_array_equal(np.asarray(r.value), product(x, w, False))


def test_a_load_on_another_mxu_than_the_push_finds_its_register_empty(check):
    r = check(_single(_other_mxu), _f32(8, 256), _f32(256, 256), config=V7X)
    assert _misuses(r.session) == [
        ("mxu-misuse", "MXU 0 staging register 0", _line(_other_mxu, "# pushed to"), None),
        ("mxu-misuse", "MXU 1 staging register 0", _line(_other_mxu, "# loaded on"), None)]
    by_buffer = {f.buffer: f for f in r.session.findings}
    load, left = by_buffer["MXU 1 staging register 0"], by_buffer["MXU 0 staging register 0"]
    assert "holds no RHS" in load.message
    assert "the kernel ends with an RHS in MXU 0 staging register 0" in left.message
    assert np.isnan(np.asarray(r.value)).all()  # multiplied by the never-written fill


def test_a_matmul_before_any_rhs_was_loaded(check):
    r = check(_single(_no_rhs), _f32(8, 256), _f32(256, 256), config=V7X)
    assert _misuses(r.session) == [
        ("mxu-misuse", "MXU 0", _line(_no_rhs, "# nothing loaded"), None)]
    assert "before any RHS was loaded" in r.session.findings[0].message
    assert np.isnan(np.asarray(r.value)).all()


def test_accumulator_addresses_never_popped_are_reported_with_their_range(check):
    x, w = _f32(8, 256), _f32(256, 256)
    r = check(_single(_half_popped), x, w, config=V7X)
    # 24 rows from address 6 take addresses 6-11; the pop of 8 rows frees 6-7.
    assert _misuses(r.session) == [
        ("mxu-misuse", "MXU 0 accumulator", _line(_half_popped, "# 24 rows"), ((8, 12),))]
    assert "addresses 8-11 (4 of them)" in r.session.findings[0].message
    np.testing.assert_array_equal(np.asarray(r.value), product(x, w, False))
