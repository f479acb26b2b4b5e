"""The fix of compile_params_bug.py: the TPU's own compiler params, `pltpu.CompilerParams`
(the grid's one axis parallel).

Run: pallas-check run samples/compile_params_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0


def scale(x):
    return pl.pallas_call(
        scale_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    np.testing.assert_allclose(np.asarray(jax.jit(scale)(x)), np.asarray(x) * 3.0)
    print("compile_params_ok: output matches")
