"""BUG: in-kernel random numbers seeded without the grid point, so every grid step draws
the same numbers (twin of stateful_random_ok.py, which seeds with `pl.program_id(0)`).

Each of the four grid steps seeds the core's PRNG with the call's seed alone,
`pltpu.prng_seed(seed_ref[0])`, and then draws uniform, normal and bernoulli samples and
raw bits: the PRNG's state is what the seed makes it, so all four output blocks hold the
same samples (the script prints how many distinct blocks it got: one). pallas-check
reports the seeding at each grid step after the first, naming grid point (0,).

Run: pallas-check run samples/stateful_random_bug.py
Expected finding: kind=random-misuse buffer=PRNG seed line=25
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = (8, 128)
STEPS = 4


def random_kernel(seed_ref, u_ref, n_ref, b_ref, bits_ref):
    pltpu.prng_seed(seed_ref[0])  # BUG: the same stream at every grid step
    u_ref[...] = pltpu.stateful_uniform(BLOCK, jnp.float32)
    n_ref[...] = pltpu.stateful_normal(BLOCK, jnp.float32)
    b_ref[...] = pltpu.stateful_bernoulli(0.3, BLOCK).astype(jnp.int32)
    bits_ref[...] = pltpu.stateful_bits(BLOCK, jnp.uint32)


@jax.jit
def sample(seed):
    shape = (STEPS * BLOCK[0], BLOCK[1])
    spec = pl.BlockSpec(BLOCK, lambda i, seed_ref: (i, 0))
    return pl.pallas_call(
        random_kernel,
        out_shape=[jax.ShapeDtypeStruct(shape, dtype)
                   for dtype in (jnp.float32, jnp.float32, jnp.int32, jnp.uint32)],
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(STEPS,),
                                               in_specs=[], out_specs=[spec] * 4),
    )(seed)


if __name__ == "__main__":
    u, n, b, bits = (np.asarray(a) for a in sample(jnp.array([7], jnp.int32)))
    assert 0.0 <= u.min() and u.max() < 1.0, (u.min(), u.max())
    blocks = bits.reshape(STEPS, -1)
    print("stateful_random_bug: distinct blocks:", len({row.tobytes() for row in blocks}),
          "of", STEPS)
