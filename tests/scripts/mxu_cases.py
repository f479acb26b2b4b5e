"""Explicit MXU operations the v7x compiler refuses, one pallas_call each, for
tests/engine/jaxpr/test_mxu_limits.py: `pallas-check compile --tpu v7x` (libtpu) and
`pallas-check run --tpu v7x --no-compile` (the simulation's own refusal) must report the
same calls, with libtpu's words.

Each case is (name, lhs shape and dtype, pushed shape and dtype, acc address, popped
shape and dtype, MXU, staging register); `python mxu_cases.py NAME` runs that one alone.
"""

import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

F32, BF16, I8 = jnp.float32, jnp.bfloat16, jnp.int8

CASES = [
    # name                  lhs            rhs               addr  popped         mxu reg
    ("compiles",            (8, 256, F32), (256, 256, F32),  0,    (8, 256, F32),  1, 1),
    ("rhs_not_square",      (8, 256, F32), (256, 128, F32),  0,    (8, 256, F32),  0, 0),
    ("lhs_k_128",           (8, 128, F32), (256, 256, F32),  0,    (8, 256, F32),  0, 0),
    ("bf16_lhs_rows_8",     (8, 256, BF16), (256, 256, BF16), 0,   (8, 256, F32),  0, 0),
    ("int8_operands",       (32, 256, I8), (256, 256, I8),   0,    (32, 256, F32), 0, 0),
    ("pop_128_wide",        (8, 256, F32), (256, 256, F32),  0,    (8, 128, F32),  0, 0),
    ("pop_int32",           (8, 256, F32), (256, 256, F32),  0,    (8, 256, jnp.int32), 0, 0),
    ("acc_out_of_range",    (1024, 256, F32), (256, 256, F32), 2,  (8, 256, F32),  0, 0),
    ("acc_odd_address",     (8, 256, F32), (256, 256, F32),  3,    (8, 256, F32),  0, 0),
    ("mxu_2",               (8, 256, F32), (256, 256, F32),  0,    (8, 256, F32),  2, 0),
    ("register_2",          (8, 256, F32), (256, 256, F32),  0,    (8, 256, F32),  0, 2),
]


def call(name, lhs, rhs, address, popped, mxu, register):
    def kernel(x_ref, w_ref, o_ref):
        pltpu.matmul_push_rhs(w_ref[...], staging_register=register, mxu_index=mxu)
        pltpu.matmul_acc_lhs(address, x_ref[...], mxu_index=mxu, load_staged_rhs=register)
        o_ref[...] = pltpu.matmul_pop(address, popped[:2], popped[2], mxu)

    kernel.__name__ = name
    out = jax.ShapeDtypeStruct(popped[:2], popped[2])
    x, w = jnp.ones(lhs[:2], lhs[2]), jnp.ones(rhs[:2], rhs[2])
    return jax.jit(lambda x, w: pl.pallas_call(kernel, out_shape=out, name=name)(x, w))(x, w)


if __name__ == "__main__":
    only = sys.argv[1:]
    for case in CASES:
        if not only or case[0] in only:
            call(*case)
    print("mxu_cases: done")
