"""Small kernels whose chip results `pallas-check record` keeps and CI replays
(hardware/recordings/): float32 products at each precision Mosaic takes, bfloat16 and int8
products, transcendental functions, a reduction, and a ragged BoundedSlice block in
emit_pipeline whose kernel reads the block's stale rows (rows the ragged copy did not bring,
holding what the buffer slot held before).

It asserts nothing: what the chip computed is the recording.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def dot(precision, out_dtype):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=precision,
                             preferred_element_type=out_dtype)
    return lambda x, y: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), out_dtype))(x, y)


def unary(fn):
    def kernel(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...])
    return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def row_sums(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.broadcast_to(jnp.sum(x_ref[...], axis=1, keepdims=True), o_ref.shape)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], 128),
                                                                 x.dtype))(x)


ROWS, BLK, KB = 200, 128, 2


def stale_rows(x):
    """out[rows, k-block] = x + the column sums of x's whole (128-row) buffer: in the
    ragged block the sums take in rows the copy did not bring."""
    def kernel(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] + jnp.sum(x_ref[...], axis=0, keepdims=True)
        spec = pl.BlockSpec(
            (pl.BoundedSlice(BLK), 128),
            lambda i, k: (pl.ds(pl.multiple_of(i * BLK, 8), jnp.minimum(BLK, ROWS - i * BLK)),
                          k))
        pltpu.emit_pipeline(body, grid=(pl.cdiv(ROWS, BLK), KB), in_specs=[spec],
                            out_specs=[spec])(x_hbm, o_hbm)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY))(x)


if __name__ == "__main__":
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    y = rng.standard_normal((256, 128)).astype(np.float32)
    for precision in (None, lax.Precision.HIGHEST):
        jax.block_until_ready(dot(precision, jnp.float32)(x, y))
    jax.block_until_ready(dot(None, jnp.float32)(x.astype(jnp.bfloat16), y.astype(jnp.bfloat16)))
    xi = rng.integers(-128, 128, (16, 256)).astype(np.int8)
    yi = rng.integers(-128, 128, (256, 128)).astype(np.int8)
    jax.block_until_ready(dot(None, jnp.int32)(xi, yi))
    grid = np.linspace(-8, 8, 8 * 128, dtype=np.float32).reshape(8, 128)
    positive = np.logspace(-6, 6, 8 * 128, dtype=np.float32).reshape(8, 128)
    for fn, v in ((jnp.exp, grid), (jnp.tanh, grid), (jax.nn.sigmoid, grid),
                  (jnp.log, positive), (jnp.log1p, positive), (lax.rsqrt, positive),
                  (lambda t: pl.reciprocal(t, approx=True), positive),
                  (jax.scipy.special.erf, grid)):
        jax.block_until_ready(unary(fn)(v))
    wide = (rng.standard_normal((8, 2048)) * np.exp(rng.uniform(-6, 6, (8, 2048)))
            ).astype(np.float32)
    jax.block_until_ready(row_sums(wide))
    out = np.asarray(stale_rows(rng.standard_normal((ROWS, 128 * KB)).astype(np.float32)))
    print("recordable: done", out[128, :2])
