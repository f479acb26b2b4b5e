"""Probe: does the v5e round each bfloat16 result of a kernel as written (session 32)?

XLA:CPU, allowed excess precision, keeps `a * b + c` of bfloat16 operands in float32
between the two operations and drops a `x.astype(bfloat16).astype(float32)` pair; the
simulation now compiles kernels without that allowance. This probe asks the chip: the
kernel's `a * b + c` (bfloat16 in and out, kept as float32; the v5e has no bfloat16 vector unit),
`(a * b).astype(float32)`, and a cast pair before a `HIGHEST` product, against models
that round after each operation or only at the end (compared on a CPU from the files).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from common import Results, call, main_guard


def chain(a, b, c):
    def kernel(a_ref, b_ref, c_ref, fma_ref, mul_ref):
        fma_ref[...] = (a_ref[...] * b_ref[...] + c_ref[...]).astype(jnp.float32)
        mul_ref[...] = (a_ref[...] * b_ref[...]).astype(jnp.float32)
    return call(kernel, out_shape=[jax.ShapeDtypeStruct(a.shape, jnp.float32),
                                   jax.ShapeDtypeStruct(a.shape, jnp.float32)])(a, b, c)


def cast_pair_dot(x, y):
    def kernel(x_ref, y_ref, o_ref):
        p = (x_ref[...] / 3.0).astype(jnp.bfloat16).astype(jnp.float32)
        o_ref[...] = jnp.dot(p, y_ref[...], precision=lax.Precision.HIGHEST)
    return call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]),
                                                       jnp.float32))(x, y)


def run(r: Results) -> None:
    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal((64, 128)).astype(jnp.bfloat16) for _ in range(3))
    for name, value in (("a", a), ("b", b), ("c", c)):
        r.array(name, value.astype(np.float32))
    r.case("chain", lambda: dict(zip(("fma", "mul"), chain(a, b, c))))
    x = rng.standard_normal((128, 128)).astype(np.float32)
    y = rng.standard_normal((128, 128)).astype(np.float32)
    r.array("x", x)
    r.array("y", y)
    r.case("cast_pair_dot", lambda: cast_pair_dot(x, y))


if __name__ == "__main__":
    main_guard(run, "bf16_rounding")
