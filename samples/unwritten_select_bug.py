"""`jnp.where` with its branches swapped keeps the launch that wrote nothing.

As unwritten_select_ok.py: a decode and a prefill kernel, each doing its work only in its
own mode. The selection is swapped (`jnp.where(is_decode, prefill_out, decode_out)`), so a
prefill step returns the decode kernel's output, which that step never wrote: the whole
output is whatever HBM held on a TPU. The finding names the decode kernel's unwritten
elements and the result they reach (all of result 0).

Expected finding: kind=unwritten-output buffer=o_ref range=[0:8, 0:128] line=20
(an unwritten element has no statement of its own: the line is the kernel's `def`)
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
    return jnp.where(flag[0] == 1, prefill_out, decode_out)  # BUG: branches swapped


if __name__ == "__main__":
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = step(jnp.array([0], jnp.int32), x)  # a prefill step
    print("unwritten_select_bug: matches the prefill reference:",
          bool(np.allclose(out, np.asarray(x) * 3.0)))
