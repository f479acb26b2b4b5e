"""`pltpu.emit_pipeline` over an array its blocks do not divide: ragged last blocks.

x is (60, 600) f32 in HBM, walked in (32, 256) blocks. The last block of each dimension
is ragged; emit_pipeline rounds its DMA up to the tile (Mosaic's (8, 128) tiling): rows
32..64 of 60 and lanes 512..640 of 600. On a TPU those extra rows and lanes are the
array's tile padding (it occupies (64, 640)): the copy in reads whatever the padding
holds, the body computes on it, and the copy out writes it back into the padding, which
no one reads. Every element of the output is right.

Run: pallas-check run samples/ragged_pipeline_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

M, N = 60, 600
BLOCK = (32, 256)


def affine_kernel(x_hbm, o_hbm):
    def block(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    grid = (pl.cdiv(M, BLOCK[0]), pl.cdiv(N, BLOCK[1]))
    pltpu.emit_pipeline(
        block, grid=grid,
        in_specs=[pl.BlockSpec(BLOCK, lambda i, j: (i, j))],
        out_specs=[pl.BlockSpec(BLOCK, lambda i, j: (i, j))],
    )(x_hbm, o_hbm)


def affine(x):
    return pl.pallas_call(
        affine_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x)


if __name__ == "__main__":
    x = np.random.default_rng(0).standard_normal((M, N)).astype(np.float32)
    out = jax.jit(affine)(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(out), x * 2.0 + 1.0, rtol=1e-6)
    print("ragged_pipeline_ok: output matches")
