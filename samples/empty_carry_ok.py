"""Fixed empty_carry_bug.py: the accumulator starts as `jnp.zeros`.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

STEPS = 3


def accumulate_kernel(x_ref, acc_ref, o_ref):
    o_ref[...] = acc_ref[...] + x_ref[...]


@jax.jit
def accumulate(x, acc):
    return pl.pallas_call(
        accumulate_kernel,
        out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype),
        input_output_aliases={1: 0},
    )(x, acc)


if __name__ == "__main__":
    acc = jnp.zeros((8, 128), jnp.float32)
    for step in range(STEPS):
        x = jnp.full((8, 128), float(step + 1), jnp.float32)
        acc = accumulate(x, acc)
    np.testing.assert_allclose(acc, np.full((8, 128), 6.0, np.float32))
    print("empty_carry_ok: output matches")
