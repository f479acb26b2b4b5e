"""BUG: int8 values packed into 32-bit words from a VMEM scratch whose last plane was never
written (twin of pack_elementwise_ok.py, which stages all four planes).

The loop that stages the four int32 planes stops at three, so the fourth source of
`pltpu.pack_elementwise` reads never-written VMEM. Its low 8 bits become the top byte of
every output word: under either never-written fill (int32 max, whose low byte is 0xFF, or
zero) the words differ, which is how the simulation, packing bit for bit, finds it.

Expected finding: kind=uninitialized buffer=planes_ref range=[3, 0:8, 0:128] line=24
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = (8, 128)


def pack_kernel(a_ref, f_ref, words_ref, halves_ref, back_ref, planes_ref):
    for j in range(3):  # BUG: plane 3 is never staged
        planes_ref[j] = a_ref[j] + j
    words = pltpu.pack_elementwise([planes_ref[j] for j in range(4)], packed_dtype=jnp.int8)
    words_ref[...] = words
    halves_ref[...] = pltpu.pack_elementwise([f_ref[0], f_ref[1]],
                                             packed_dtype=jnp.bfloat16)
    back_ref[...] = pltpu.unpack_elementwise(words, index=2, packed_dtype=jnp.int8,
                                             unpacked_dtype=jnp.int32)


def pack(a, f):
    rows = a.shape[1]
    word = jax.ShapeDtypeStruct((rows, 128), jnp.uint32)
    return pl.pallas_call(
        pack_kernel,
        grid=(rows // BLOCK[0],),
        in_specs=[pl.BlockSpec((4, *BLOCK), lambda i: (0, i, 0)),
                  pl.BlockSpec((2, *BLOCK), lambda i: (0, i, 0))],
        out_specs=[pl.BlockSpec(BLOCK, lambda i: (i, 0))] * 3,
        out_shape=[word, word, jax.ShapeDtypeStruct((rows, 128), jnp.int32)],
        scratch_shapes=[pltpu.VMEM((4, *BLOCK), jnp.int32)],
    )(a, f)


if __name__ == "__main__":
    rng = np.random.default_rng(54)
    a = rng.integers(-2**31, 2**31 - 4, (4, 16, 128), dtype=np.int32)
    f = rng.standard_normal((2, 16, 128)).astype(np.float32)
    f[0, 0, :4] = [1 + 2**-8, 1 + 3 * 2**-8, -0.0, np.inf]  # ties to even, signs, inf
    words, halves, back = jax.jit(pack)(jnp.asarray(a), jnp.asarray(f))
    # Byte j of a little-endian uint32 is bits [8j, 8j + 8): the layout the ops state.
    planes = a + np.arange(4, dtype=np.int32)[:, None, None]
    want_words = np.ascontiguousarray(np.moveaxis(planes.astype(np.int8), 0, -1)).view(
        np.uint32)
    print("pack_elementwise_bug: matches reference:",
          bool(np.array_equal(np.asarray(words), want_words[..., 0])))
