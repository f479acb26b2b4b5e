"""Narrow values packed into 32-bit words and unpacked again, as a TPU kernel does to move
int8 or bfloat16 data through int32 / uint32 lanes (`pltpu.pack_elementwise`,
`pltpu.unpack_elementwise`).

The kernel stages four int32 planes in a VMEM scratch (plane j is input plane j plus j),
packs them to int8 (each truncated to its low 8 bits, plane 0 in the word's lowest byte)
and two float32 blocks to bfloat16 (rounded to nearest even, the first in the low half);
the int8 words are unpacked again, field 2 of each word, sign-extended. (The bug twin
stages only three planes: the fourth byte of every word is never-written VMEM.)
The script checks each output against a numpy reference that builds the words from bytes
laid out little-endian (numpy's own view), not from pallas-check's arithmetic. The layout is
JAX 0.10.2's statement of the ops; pallas-check has not checked it on a chip.

Run: pallas-check run samples/pack_elementwise_ok.py
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = (8, 128)


def pack_kernel(a_ref, f_ref, words_ref, halves_ref, back_ref, planes_ref):
    for j in range(4):
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
    want_halves = np.ascontiguousarray(
        np.moveaxis(f.astype(ml_dtypes.bfloat16), 0, -1)).view(np.uint32)
    np.testing.assert_array_equal(np.asarray(words), want_words[..., 0])
    np.testing.assert_array_equal(np.asarray(halves), want_halves[..., 0])
    np.testing.assert_array_equal(np.asarray(back),
                                  planes[2].astype(np.int8).astype(np.int32))
    print("pack_elementwise_ok: output matches")
