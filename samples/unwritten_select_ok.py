"""A launch that writes nothing, dropped by `jnp.where`: nothing to report.

A serving step runs both a decode kernel and a prefill kernel and picks one with
`jnp.where(is_decode, decode_out, prefill_out)`. Each kernel reads the flag (scalar
prefetch) and does its work only in its own mode, so in a prefill step the decode
kernel writes nothing at all: its whole output is never written. `jnp.where` keeps the
prefill output, fully written; the decode output never reaches what the program keeps,
so pallas-check reports nothing.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def decode_kernel(flag_ref, x_ref, o_ref):
    @pl.when(flag_ref[0] == 1)
    def _():
        o_ref[...] = x_ref[...] + 1.0


def prefill_kernel(flag_ref, x_ref, o_ref):
    @pl.when(flag_ref[0] == 0)
    def _():
        o_ref[...] = x_ref[...] * 3.0


def launch(kernel, flag, x):
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, flag: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, flag: (0, 0))),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(flag, x)


@jax.jit
def step(flag, x):
    decode_out = launch(decode_kernel, flag, x)
    prefill_out = launch(prefill_kernel, flag, x)
    return jnp.where(flag[0] == 1, decode_out, prefill_out)


if __name__ == "__main__":
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = step(jnp.array([0], jnp.int32), x)  # a prefill step
    np.testing.assert_allclose(out, np.asarray(x) * 3.0)
    print("unwritten_select_ok: output matches")
