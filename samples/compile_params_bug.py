"""A GPU kernel's compiler params left on a TPU pallas_call: Triton's
`CompilerParams(num_warps=4)` where the TPU takes `pltpu.CompilerParams`.

The kernel scales rows; ported from its GPU version, it kept the Triton params. JAX's
interpreters ignore compiler params, so the outputs look right anywhere but a TPU, whose
lowering refuses the call (an assertion that the params are Mosaic's). pallas-check reports
it at the line that made the call, with or without --compile, and skips the call (its
output is left never written: NaN).

Expected finding: kind=compile-error buffer= line=25
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0


def scale(x):
    return pl.pallas_call(
        scale_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=4),  # BUG: Triton's, not Mosaic's
    )(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = jax.jit(scale)(x)
    print("compile_params_bug: first row", np.asarray(out)[0, :4])
