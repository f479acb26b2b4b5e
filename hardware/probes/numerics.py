"""Probe: how the chip rounds matrix products, transcendental functions and reductions,
inside a Pallas kernel (Mosaic) and in the program's own XLA ops (XLA:TPU).

Matrix products: for each input dtype and `precision` the kernel computes `dot(x, y)`; two
more products expose the rounding of each operand alone: `dot(x, I)` and `dot(I, y)` with an
identity matrix I (exact in every dtype), whose result is the operand as the MXU saw it.
The same products are computed by XLA outside any kernel. The analysis compares each with
candidate models (exact; operands rounded to bf16 once; bf16x3; bf16x6) on a CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from common import Results, call, main_guard

M, K, N = 128, 256, 128
PRECISIONS = {"none": None, "default": lax.Precision.DEFAULT, "high": lax.Precision.HIGH,
              "highest": lax.Precision.HIGHEST}


def kernel_dot(x, y, precision, out_dtype):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=precision,
                             preferred_element_type=out_dtype).astype(o_ref.dtype)
    return call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]),
                                                       out_dtype))(x, y)


def xla_dot(x, y, precision, out_dtype):
    return jax.jit(lambda a, b: jnp.dot(a, b, precision=precision,
                                        preferred_element_type=out_dtype))(x, y)


def matmuls(r: Results) -> None:
    rng = np.random.default_rng(0)
    x32 = rng.standard_normal((M, K)).astype(np.float32)
    y32 = rng.standard_normal((K, N)).astype(np.float32)
    eye = np.eye(K, dtype=np.float32)
    r.array("x32", x32)
    r.array("y32", y32)
    cases = []
    for pname, prec in PRECISIONS.items():
        cases.append((f"f32.{pname}", x32, y32, prec, jnp.float32))
    xb, yb = x32.astype(jnp.bfloat16), y32.astype(jnp.bfloat16)
    for pname in ("none", "highest"):
        cases.append((f"bf16_f32out.{pname}", xb, yb, PRECISIONS[pname], jnp.float32))
    cases.append(("bf16_bf16out.none", xb, yb, None, jnp.bfloat16))
    cases.append(("mixed_f32_bf16.none", x32, yb, None, jnp.float32))
    xi8 = rng.integers(-128, 128, (M, K)).astype(np.int8)
    yi8 = rng.integers(-128, 128, (K, N)).astype(np.int8)
    r.array("xi8", xi8)
    r.array("yi8", yi8)
    cases.append(("int8_int32out.none", xi8, yi8, None, jnp.int32))
    for f8 in ("float8_e4m3fn", "float8_e5m2"):
        dt = jnp.dtype(f8)
        cases.append((f"{f8}_f32out.none", x32.astype(dt), y32.astype(dt), None, jnp.float32))
    for key, x, y, prec, odt in cases:
        r.case(f"kernel.{key}", functools.partial(kernel_dot, x, y, prec, odt))
        r.case(f"xla.{key}", functools.partial(xla_dot, x, y, prec, odt))
    # The operands as the MXU saw them: x @ I and I @ y.
    for pname, prec in PRECISIONS.items():
        r.case(f"kernel.lhs_seen.{pname}",
               functools.partial(kernel_dot, x32, eye[:, :N], prec, jnp.float32))
        r.case(f"kernel.rhs_seen.{pname}",
               functools.partial(kernel_dot, eye[:M, :], y32, prec, jnp.float32))
        r.case(f"xla.lhs_seen.{pname}",
               functools.partial(xla_dot, x32, eye[:, :N], prec, jnp.float32))
    # A long contraction: how the sum accumulates (f32, and in what order).
    xl = rng.standard_normal((8, 4096)).astype(np.float32)
    yl = rng.standard_normal((4096, 128)).astype(np.float32)
    r.array("xl", xl)
    r.array("yl", yl)
    for pname in ("default", "highest"):
        r.case(f"kernel.long.{pname}",
               functools.partial(kernel_dot, xl, yl, PRECISIONS[pname], jnp.float32))
        r.case(f"xla.long.{pname}",
               functools.partial(xla_dot, xl, yl, PRECISIONS[pname], jnp.float32))
    # bf16 inputs through the default precision of a jnp.matmul of f32 that were bf16
    # already: the identity x @ I with x exactly bf16 (no rounding to see: a control).


UNARY = {
    "exp": (jnp.exp, (-80.0, 80.0)),
    "log": (jnp.log, "logspace"),
    "tanh": (jnp.tanh, (-10.0, 10.0)),
    "logistic": (jax.nn.sigmoid, (-30.0, 30.0)),
    "sin": (jnp.sin, (-100.0, 100.0)),
    "cos": (jnp.cos, (-100.0, 100.0)),
    "sqrt": (jnp.sqrt, "logspace"),
    "rsqrt": (lax.rsqrt, "logspace"),
    "recip": (lambda v: 1.0 / v, "logspace"),
    "recip_approx": (lambda v: pl.reciprocal(v, approx=True), "logspace"),
    "erf": (jax.scipy.special.erf, (-5.0, 5.0)),
    "log1p": (jnp.log1p, (-0.9, 10.0)),
    "expm1": (jnp.expm1, (-10.0, 10.0)),
    "exp2": (jnp.exp2, (-100.0, 100.0)),
    "pow2_5": (lambda v: v ** 2.5, (0.0, 100.0)),
    "atan": (jnp.arctan, (-100.0, 100.0)),
    "erf_inv": (jax.scipy.special.erfinv, (-0.999, 0.999)),
}


def unary_input(domain, shape=(8, 1024)) -> np.ndarray:
    n = int(np.prod(shape))
    if domain == "logspace":
        v = np.logspace(-30, 30, n, dtype=np.float64)
    else:
        v = np.linspace(domain[0], domain[1], n, dtype=np.float64)
    return v.astype(np.float32).reshape(shape)


def kernel_unary(fn, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...]).astype(o_ref.dtype)
    return call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def transcendentals(r: Results) -> None:
    for name, (fn, domain) in UNARY.items():
        x = unary_input(domain)
        r.array(f"in.{name}", x)
        r.case(f"kernel.unary.{name}", functools.partial(kernel_unary, fn, x))
        if name != "recip_approx":
            r.case(f"xla.unary.{name}", functools.partial(jax.jit(fn), x))
    xb = unary_input((-20.0, 20.0)).astype(jnp.bfloat16)
    r.array("in.exp_bf16", xb.astype(np.float32))
    r.case("kernel.unary.exp_bf16", functools.partial(kernel_unary, jnp.exp, xb))
    r.case("xla.unary.exp_bf16", functools.partial(jax.jit(jnp.exp), xb))
    # division of two arrays
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 1024)).astype(np.float32)
    b = rng.standard_normal((8, 1024)).astype(np.float32)
    r.array("div.a", a)
    r.array("div.b", b)

    def kdiv(a, b):
        def kernel(a_ref, b_ref, o_ref):
            o_ref[...] = a_ref[...] / b_ref[...]
        return call(kernel, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype))(a, b)
    r.case("kernel.div", functools.partial(kdiv, a, b))
    r.case("xla.div", functools.partial(jax.jit(lambda p, q: p / q), a, b))


def reductions(r: Results) -> None:
    rng = np.random.default_rng(2)
    # wide magnitudes: where the order of a float sum shows
    x = (rng.standard_normal((8, 4096)) * np.exp(rng.uniform(-8, 8, (8, 4096)))).astype(np.float32)
    r.array("red.x", x)

    def krows(fn, x):
        def kernel(x_ref, o_ref):
            o_ref[...] = jnp.broadcast_to(fn(x_ref[...], axis=1, keepdims=True), o_ref.shape)
        return call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], 128), x.dtype))(x)
    for name, fn in (("sum", jnp.sum), ("max", jnp.max), ("mean", jnp.mean)):
        r.case(f"kernel.red.rows.{name}", functools.partial(krows, fn, x))
        r.case(f"xla.red.rows.{name}",
               functools.partial(jax.jit(lambda v, f=fn: f(v, axis=1, keepdims=True)), x))
    xc = x.reshape(256, 128)

    def kcols(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = jnp.broadcast_to(jnp.sum(x_ref[...], axis=0, keepdims=True), o_ref.shape)
        return call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype))(x)
    r.case("kernel.red.cols.sum", functools.partial(kcols, xc))
    r.case("xla.red.cols.sum", functools.partial(jax.jit(lambda v: jnp.sum(v, axis=0)), xc))
    xb = x.astype(jnp.bfloat16)
    r.case("kernel.red.rows.sum_bf16", functools.partial(krows, jnp.sum, xb))
    r.case("xla.red.rows.sum_bf16",
           functools.partial(jax.jit(lambda v: jnp.sum(v, axis=1, keepdims=True)), xb))


def run(r: Results) -> None:
    matmuls(r)
    transcendentals(r)
    reductions(r)


if __name__ == "__main__":
    main_guard(run, "numerics")
