"""An output index_map that returns to a block, and whose last visit does not rewrite it all.

Four grid steps visit output blocks 0, 1, 0, 1 (lambda i: (i % 2, 0)). The first visit of a
block writes its top half, the second visit its bottom half. A TPU writes an output block
back when its index changes and never reads it back in: the second visit starts from a
buffer holding nothing of the first, and its write-back, which lands last, overwrites the
top half with whatever that buffer held. (Had the second visit rewritten every element,
nothing would be lost: see output_revisited_ok.py.)

Expected finding: kind=output-revisited buffer=o_ref range=[0:4, 0:128] line=38
(the line is the out_specs index_map; rows 0:4 of block 0, written at grid point (0,), are
not written again by its last visit at grid point (2,))
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def halves_kernel(x_ref, o_ref):
    i = pl.program_id(0)

    @pl.when(i < 2)
    def _():
        o_ref[0:4, :] = x_ref[0:4, :]

    @pl.when(i >= 2)
    def _():
        o_ref[4:8, :] = x_ref[4:8, :]


def halves(x):
    return pl.pallas_call(
        halves_kernel,
        grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i % 2, 0)),  # BUG: 0, 1, 0, 1
        out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(halves)(x)
    blocks = np.asarray(x).reshape(4, 8, 128)
    expected = np.concatenate([np.concatenate([blocks[0, :4], blocks[2, 4:]]),
                               np.concatenate([blocks[1, :4], blocks[3, 4:]])])
    print("output_revisited_bug: output", "matches" if np.allclose(out, expected)
          else "is wrong")
