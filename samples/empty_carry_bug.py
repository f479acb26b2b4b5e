"""An accumulator made by `jnp.empty`, read by the kernel before anything wrote it.

A running sum carried from step to step: each step's kernel reads the carry and adds
the step's block (the carry is aliased to the output, as a KV cache or an accumulator
is). The first carry comes from `jnp.empty`: jax 0.10 fills it with zeros on a CPU, so
the script "works" here, but on a TPU (and on every backend from jax 0.11) it holds
whatever the memory held. pallas-check treats an array the script made with `jnp.empty`
as never-written memory: the kernel's first read of it is `uninitialized`.

Expected finding: kind=uninitialized buffer=acc_ref range=[0:8, 0:128] line=22
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
    acc = jnp.empty((8, 128), jnp.float32)  # BUG: should be jnp.zeros
    for step in range(STEPS):
        x = jnp.full((8, 128), float(step + 1), jnp.float32)
        acc = accumulate(x, acc)
    print("empty_carry_bug: acc[0, 0] =", float(np.asarray(acc)[0, 0]))
