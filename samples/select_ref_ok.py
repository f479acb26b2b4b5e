"""A gather whose source ref is picked at run time: each grid step copies 8 rows either
from the cache (at the step's offset) or from the new rows, as its scalar-prefetched flag
says (`pl.select_ref(flag, cache.at[...], new)`: flag 0 picks the first ref).

Run: pallas-check run samples/select_ref_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def gather_kernel(use_new, starts, cache_hbm, new_hbm, o_ref, buf, sem):
    i = pl.program_id(0)
    src = pl.select_ref(use_new[i], cache_hbm.at[pl.ds(starts[i], 8)], new_hbm)
    pltpu.async_copy(src, buf, sem).wait()
    o_ref[...] = buf[...] + 1.0


def gather(use_new, starts, cache, new):
    return pl.pallas_call(
        gather_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(3,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i, use_new, starts: (i, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA]),
        out_shape=jax.ShapeDtypeStruct((3 * 8, 128), jnp.float32),
    )(use_new, starts, cache, new)


if __name__ == "__main__":
    cache = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    new = -jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    use_new = jnp.array([0, 1, 0], jnp.int32)
    starts = jnp.array([8, 0, 0], jnp.int32)
    out = jax.jit(gather)(use_new, starts, cache, new)
    want = np.concatenate([cache[8:16], new, cache[0:8]]) + 1.0
    np.testing.assert_allclose(out, want)
    print("select_ref_ok: output matches")
