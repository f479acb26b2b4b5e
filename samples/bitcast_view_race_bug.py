"""Two DMAs fill the halves of an f32 scratch seen as bf16; the second lands on the first.

The scratch `buf` (16, 128) f32 holds a (32, 128) bf16 array packed two rows per f32
row (the TPU's layout), written through `buf.bitcast(bf16)`. Rows 0..16 of the view
(buf rows 0..8) take the first half of x, rows 16..32 (buf rows 8..16) the second. The
second copy's offset is 8 instead of 16: both copies are in flight at once and write
buf rows 4..8 — which lands last is up to the DMA engines.

Expected finding: kind=race buffer=buf range=[4:8, 0:128] line=28 args=--races
(pallas-check tracks the bitcast view element by element: the copies of the fixed twin,
into disjoint halves of the same view, do not race)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def unpack_kernel(x_hbm, o_ref, buf, sems):
    view = buf.bitcast(jnp.bfloat16)  # (32, 128) bf16
    first = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 16)], view.at[pl.ds(0, 16)], sems.at[0])
    # BUG: the second half starts at row 16 of the view, not 8.
    second = pltpu.make_async_copy(x_hbm.at[pl.ds(16, 16)], view.at[pl.ds(8, 16)],
                                   sems.at[1])
    first.start()
    second.start()
    first.wait()
    second.wait()
    o_ref[...] = view[...].astype(jnp.float32)


def unpack(x):
    return pl.pallas_call(
        unpack_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


if __name__ == "__main__":
    x = (jnp.arange(32 * 128) % 251).astype(jnp.bfloat16).reshape(32, 128)
    out = jax.jit(unpack)(x)
    print("bitcast_view_race_bug: matches reference:",
          bool(np.array_equal(out, x.astype(jnp.float32))))
