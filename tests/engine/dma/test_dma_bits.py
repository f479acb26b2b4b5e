"""A DMA moves bytes (issue 35, item 3a): through a bitcast view, out of one, through a
reshape, HBM to VMEM and VMEM to VMEM, every bit pattern arrives exactly (NaN payloads,
signalling NaNs, denormals, 0x3f50f195, which a uint32 -> f32 -> uint32 conversion turned
into 0x3f50f180). A DMA between two element types is no conversion either: Mosaic's
verifier refuses it ("DMA source and target element type mismatch"; seen with jax 0.10.2
and libtpu for f32 -> int32 and f32 -> int8), a `compile-error` finding; int32 and uint32
are one type there (signless i32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.findings.finding import FindingKind

SPECIAL = [0x3F50F195, 0x7FC00001, 0x7F800001, 0xFFC00123, 0x7FBFFFFF, 0xFFBFFFFF,
           0x00000001, 0x807FFFFF, 0x00400000, 0x80000000, 0x7F800000, 0xFF800000,
           0xFFFFFFFF, 0x7FFFFFFF]


def _bits(shape=(16, 128), seed=0) -> np.ndarray:
    bits = np.random.default_rng(seed).integers(0, 2**32, int(np.prod(shape)), np.uint64)
    bits[:len(SPECIAL)] = SPECIAL
    bits[-len(SPECIAL):] = SPECIAL
    return bits.astype(np.uint32).reshape(shape)


def _call(kernel, out_shape, out_dtype, *scratch):
    def call(x):
        return pl.pallas_call(
            kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY), scratch_shapes=list(scratch),
            out_shape=jax.ShapeDtypeStruct(out_shape, out_dtype))(x)
    return jax.jit(call)


def _into_bitcast_view(x_hbm, o_hbm, buf, sem):
    """HBM uint32 -> the uint32 view of an f32 scratch -> HBM uint32 (plain f32 out)."""
    pltpu.async_copy(x_hbm, buf.bitcast(jnp.uint32), sem).wait()
    pltpu.async_copy(buf, o_hbm, sem).wait()


def _out_of_bitcast_view(x_hbm, o_hbm, buf, sem):
    """HBM f32 -> an f32 scratch -> out of its uint32 view into HBM uint32."""
    pltpu.async_copy(x_hbm, buf, sem).wait()
    pltpu.async_copy(buf.bitcast(jnp.uint32), o_hbm, sem).wait()


def _through_reshape(x_hbm, o_hbm, buf, sem):
    """HBM uint32 (16, 128) -> a (2, 8, 128) f32 scratch seen as uint32 (16, 128)."""
    view = buf.bitcast(jnp.uint32).reshape(16, 128)
    pltpu.async_copy(x_hbm, view, sem).wait()
    pltpu.async_copy(view, o_hbm, sem).wait()


def _local_into_view(x_hbm, o_hbm, staging, buf, sem):
    """VMEM uint32 -> (a local DMA) the uint32 view of a VMEM f32 scratch."""
    pltpu.async_copy(x_hbm, staging, sem).wait()
    pltpu.async_copy(staging, buf.bitcast(jnp.uint32), sem).wait()
    pltpu.async_copy(buf.bitcast(jnp.uint32), o_hbm, sem).wait()


def _packed_view(x_hbm, o_hbm, buf, sem):
    """HBM uint32 (8, 128) -> the uint32 view of a (16, 128) bf16 scratch (two bf16 rows
    per uint32 row) -> HBM bf16 (16, 128)."""
    pltpu.async_copy(x_hbm, buf.bitcast(jnp.uint32), sem).wait()
    pltpu.async_copy(buf, o_hbm, sem).wait()


def _signless(x_hbm, o_hbm, buf, sem):
    """HBM int32 -> VMEM uint32: one element type to Mosaic (i32)."""
    pltpu.async_copy(x_hbm, buf, sem).wait()
    pltpu.async_copy(buf, o_hbm, sem).wait()


def _unpack_rows(bits: np.ndarray) -> np.ndarray:
    """uint32 rows -> bf16 rows as the TPU packs them: row 2r + s holds half s of row r."""
    halves = bits.view(np.uint16).reshape(bits.shape[0], bits.shape[1], 2)
    return halves.transpose(0, 2, 1).reshape(2 * bits.shape[0], bits.shape[1])


SEM = pltpu.SemaphoreType.DMA
ROUTES = {
    "into_bitcast_view": (lambda: _call(_into_bitcast_view, (16, 128), jnp.float32,
                                        pltpu.VMEM((16, 128), jnp.float32), SEM),
                          lambda b: b, lambda out: out.view(np.uint32)),
    "out_of_bitcast_view": (lambda: _call(_out_of_bitcast_view, (16, 128), jnp.uint32,
                                          pltpu.VMEM((16, 128), jnp.float32), SEM),
                            lambda b: b.view(np.float32), lambda out: out),
    "through_reshape": (lambda: _call(_through_reshape, (16, 128), jnp.uint32,
                                      pltpu.VMEM((2, 8, 128), jnp.float32), SEM),
                        lambda b: b, lambda out: out),
    "local_dma": (lambda: _call(_local_into_view, (16, 128), jnp.uint32,
                                pltpu.VMEM((16, 128), jnp.uint32),
                                pltpu.VMEM((16, 128), jnp.float32), SEM),
                  lambda b: b, lambda out: out),
    "signless": (lambda: _call(_signless, (16, 128), jnp.uint32,
                               pltpu.VMEM((16, 128), jnp.uint32), SEM),
                 lambda b: b.view(np.int32), lambda out: out),
}


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER], ids=lambda m: m.value)
@pytest.mark.parametrize("route", list(ROUTES))
def test_every_bit_pattern_arrives_exactly(check, route, mode):
    make, to_input, to_bits = ROUTES[route]
    bits = _bits()
    result = check(make(), jnp.asarray(to_input(bits)),
                   config=Config(dma_mode=mode, races=True))
    assert result.session.engine_error is None, result.session.engine_error
    assert result.findings == [], [f.message for f in result.findings]
    got = to_bits(np.asarray(result.value))
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, bits)  # bit for bit, NaN payloads included
    assert got[0, 0] == 0x3F50F195


def test_a_packed_view_moves_bits_in_the_tpu_layout(check):
    """Through the uint32 view of a bf16 scratch: each uint32 row lands as two bf16 rows
    (low half first), every bf16 bit pattern (bf16 NaNs and denormals) intact."""
    bits = _bits((8, 128), seed=1)
    make = _call(_packed_view, (16, 128), jnp.bfloat16, pltpu.VMEM((16, 128), jnp.bfloat16),
                 SEM)
    result = check(make, jnp.asarray(bits), config=Config(races=True))
    assert result.findings == [], [f.message for f in result.findings]
    got = np.asarray(result.value).view(np.uint16)
    np.testing.assert_array_equal(got, _unpack_rows(bits))


def test_a_dma_between_element_types_is_a_compile_error(check):
    """f32 HBM -> uint32 VMEM with no bitcast: Mosaic refuses it; the call is skipped with
    a `compile-error` at the DMA's line (before, the engine converted the values)."""
    make = _call(_signless, (16, 128), jnp.uint32, pltpu.VMEM((16, 128), jnp.uint32), SEM)
    result = check(make, jnp.asarray(_bits().view(np.float32)), config=Config())
    (finding,) = result.findings
    assert finding.kind == FindingKind.COMPILE_ERROR
    assert "element type mismatch" in finding.message
    assert "x_hbm (float32) to buf (uint32)" in finding.message
    assert finding.frames[0].line == _signless.__code__.co_firstlineno + 2
