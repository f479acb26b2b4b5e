"""Scalar integer segments run by numpy (engine/jaxpr/scalar.py) give exactly what XLA gives:
wrap-around, division and remainder toward zero, conversions, selects, and the inputs
numpy would answer differently (division by zero, INT_MIN / -1) through the compiled
segment."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_check.engine.jaxpr.scalar import scalar_segment_fn

I32 = np.iinfo(np.int32)
EDGES = [0, 1, -1, 2, -2, 7, -7, 13, I32.max, I32.min, I32.max - 1, I32.min + 1]


def _numpy_fn(fn, *example):
    closed = jax.make_jaxpr(fn)(*example)
    jaxpr = closed.jaxpr
    compiled = jax.jit(lambda *a: list(jax.core.eval_jaxpr(jaxpr, closed.consts, *a)))
    fast = scalar_segment_fn(jaxpr.eqns, jaxpr.invars, jaxpr.outvars, compiled)
    if fast is None:
        return None, compiled

    def as_in_the_engine(*args):
        with np.errstate(over="ignore"):  # as kernel._run evaluates every call
            return fast(*args)

    return as_in_the_engine, compiled


def _int_ops(a, b):
    s = a + b
    return [s, a - b, a * b, lax.div(a, b), lax.rem(a, b), jnp.maximum(a, b),
            jnp.minimum(a, b), a & b, a | b, a ^ b, -a, ~a, a < b, a == b, a >= b,
            lax.select(a > b, s, b), lax.convert_element_type(a, jnp.uint32),
            lax.convert_element_type(a > 0, jnp.int32), lax.convert_element_type(a, bool),
            lax.select_n(lax.rem(b & 3, 3), a, b, s), lax.clamp(-7, a, b), lax.clamp(b, a, 13)]


def _same_on_int32_edges(fast, compiled, outputs: int) -> None:
    """Every pair of int32 edge values gives XLA's results: values, dtypes, scalars."""
    assert fast is not None
    for a, b in itertools.product(EDGES, EDGES):
        args = (np.int32(a), np.int32(b))
        got, want = fast(*args), compiled(*args)
        assert len(got) == len(want) == outputs
        for g, w in zip(got, want):
            g, w = np.asarray(g), np.asarray(w)
            assert g.dtype == w.dtype and g.shape == w.shape == ()
            assert g == w, (a, b, g, w)


def test_int32_segments_match_xla_bit_for_bit():
    _same_on_int32_edges(*_numpy_fn(_int_ops, np.int32(0), np.int32(1)), outputs=22)


def test_unsigned_remainder_and_conversion_back():
    fast, compiled = _numpy_fn(
        lambda u, v: [lax.rem(u, v), lax.div(u, v), u * v,
                      lax.convert_element_type(u, jnp.int32)],
        np.uint32(0), np.uint32(1))
    for u, v in itertools.product([0, 1, 5, 2**31, 2**32 - 1], [0, 1, 3, 2**32 - 1]):
        args = (np.uint32(u), np.uint32(v))
        for g, w in zip(fast(*args), compiled(*args)):
            assert np.asarray(g).dtype == np.asarray(w).dtype and g == w, (u, v, g, w)


def test_segments_with_arrays_or_floats_stay_compiled():
    assert _numpy_fn(lambda a: a + 1, np.zeros(3, np.int32))[0] is None
    assert _numpy_fn(lambda a: a + 1.0, np.float32(0))[0] is None
    assert _numpy_fn(lambda a: lax.shift_left(a, 3), np.int32(0))[0] is None


def test_inputs_of_any_kind_are_taken_at_the_segment_dtype():
    fast, _ = _numpy_fn(lambda a, b: [a * b], np.int32(0), np.int32(0))
    for x in (3, np.int64(3), jnp.int32(3), np.asarray(3, np.int32)):
        (out,) = fast(x, np.int32(-5))
        assert type(out) is np.int32 and out == -15


def test_scalar_jits_are_inlined_bit_for_bit():
    """`jnp.where` on scalars is a jit of a select; a double-buffer's next slot is one. Its
    body runs in numpy too (else its result, an XLA array, costs a device read at every
    DMA it indexes); nested jits and dropped results included."""

    @jax.jit
    def inner(a, b):
        return jnp.where(a > b, a - b, b * 2), a & 1

    def fn(a, b):
        slot = jnp.where(a == 0, 1, 0)
        diff, _ = inner(a, b)
        return [slot, diff, jax.jit(lambda x: x + slot)(b)]

    closed = jax.make_jaxpr(fn)(np.int32(0), np.int32(1))
    assert [e.primitive.name for e in closed.jaxpr.eqns].count("jit") == 3
    _same_on_int32_edges(*_numpy_fn(fn, np.int32(0), np.int32(1)), outputs=3)
