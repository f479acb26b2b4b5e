"""compile_alignment_bug.py fixed: windows a whole lane tile (128) apart, which Mosaic
proves aligned.

Run: pallas-check run samples/compile_alignment_ok.py --compile --tpu v5e,v6e,v7x
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

STEP = 128


def window_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[...] = x_ref[:, pl.ds(pl.multiple_of(i * STEP, 128), 128)]


def windows(x, count):
    return pl.pallas_call(
        window_kernel,
        grid=(count,),
        in_specs=[pl.BlockSpec(x.shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((x.shape[0], 128), lambda i: (0, i)),
        out_shape=jax.ShapeDtypeStruct((x.shape[0], 128 * count), x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(8 * 512, dtype=jnp.float32).reshape(8, 512)
    expected = jnp.concatenate([x[:, i * STEP:i * STEP + 128] for i in range(3)], axis=1)
    np.testing.assert_allclose(jax.jit(windows, static_argnums=1)(x, 3), expected)
    print("compile_alignment_ok: output matches")
