"""`pltpu.emit_pipeline` with a grid counted in tiles, not blocks: blocks past the array.

As ragged_pipeline_ok.py, x is (60, 600) f32 walked in (32, 256) blocks, but the grid's
lane dimension is counted in 128-lane tiles (`pl.cdiv(N, 128)` = 5, not 3 blocks). The
ragged block 2 (lanes 512..640, rounded up into the tile padding) is fine; block 3 copies
lanes 768..1024 of a 600-lane array (640 with its padding): on a TPU the DMA reads other
memory, and the copy out writes over it.

Expected finding: kind=out-of-bounds buffer=x_hbm range=[0:32, 768:1024] line=28
(the ragged block 2 is no finding: it stays inside the array's tile padding)
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

    grid = (pl.cdiv(M, BLOCK[0]), pl.cdiv(N, 128))  # BUG: tiles of 128, blocks of 256
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
    print("ragged_pipeline_bug: matches reference:",
          np.allclose(np.asarray(out), x * 2.0 + 1.0, rtol=1e-6))
