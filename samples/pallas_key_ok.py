"""A typed PRNG key as a kernel operand: `pltpu.to_pallas_key` makes a `key<pl>` array,
passed whole in SMEM, and each grid step samples its (16, 128) block of uniforms with
`pltpu.sample_block`, which folds each (8, 128) tile's index into the key. The script
checks the ranges, the same output for the same key, another key's other output, tiles
of their own, and sample_block's promise: sampled in (32, 128) blocks, the array is the
same, bit for bit.

Run: pallas-check run samples/pallas_key_ok.py
Expected findings: none.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

TOTAL = (32, 256)
TILE = (8, 128)


def uniform_kernel(key_ref, o_ref, *, block):
    o_ref[...] = pltpu.sample_block(jax.random.uniform, key_ref[0, 0], block_size=block,
                                    tile_size=TILE, total_size=TOTAL)


@functools.partial(jax.jit, static_argnames="block")
def uniforms(key, block=(16, 128)):
    return pl.pallas_call(
        functools.partial(uniform_kernel, block=block),
        out_shape=jax.ShapeDtypeStruct(TOTAL, jnp.float32),
        grid=(TOTAL[0] // block[0], TOTAL[1] // block[1]),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
    )(key)


def pallas_key(seed):
    return pltpu.to_pallas_key(jax.random.key(seed))[None, None]  # key<pl>[1, 1]


if __name__ == "__main__":
    out = np.asarray(uniforms(pallas_key(0)))
    assert out.shape == TOTAL
    assert 0.0 <= out.min() and out.max() < 1.0, (out.min(), out.max())
    assert abs(out.mean() - 0.5) < 0.02, out.mean()
    np.testing.assert_array_equal(uniforms(pallas_key(0)), out)
    assert np.mean(np.asarray(uniforms(pallas_key(1))) == out) < 0.01, "keys share numbers"
    tiles = out.reshape(4, TILE[0], 2, TILE[1]).transpose(0, 2, 1, 3).reshape(8, -1)
    assert len({t.tobytes() for t in tiles}) == 8, "tiles share numbers"
    np.testing.assert_array_equal(uniforms(pallas_key(0), block=(32, 128)), out)
    print("pallas_key_ok: output matches")
