"""The kernel the child-process scripts share (tests/cli/test_child_processes.py).

`block_sum` adds its input into a VMEM accumulator that is never zeroed first: one
finding, kind=uninitialized buffer=acc_ref, at the `+=` line, in every process that runs
it under pallas-check (the same defect: merged into one finding, counted per call).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def block_sum_kernel(x_ref, o_ref, acc_ref):
    acc_ref[...] += x_ref[...]  # BUG: read before anything was written
    o_ref[...] = acc_ref[...]


def block_sum(x):
    return pl.pallas_call(
        block_sum_kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
    )(x)
