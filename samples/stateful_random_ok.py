"""In-kernel random numbers from the core's PRNG: each grid step seeds it with the
call's seed and its grid index (`pltpu.prng_seed(seed, i)`), then draws uniform, normal
and bernoulli samples and raw bits with `pltpu.stateful_*`. The script checks what the
chip guarantees, not the chip's bits (pallas-check's generator is its own): the ranges,
the moments within statistical bounds on 4096 samples each, the same bits for the same
seed, and a stream of its own for each grid step and each seed.

Run: pallas-check run samples/stateful_random_ok.py
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = (8, 128)
STEPS = 4


def random_kernel(seed_ref, u_ref, n_ref, b_ref, bits_ref):
    pltpu.prng_seed(seed_ref[0], pl.program_id(0))  # a stream per seed and grid step
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
    assert u.shape == n.shape == b.shape == bits.shape == (STEPS * BLOCK[0], BLOCK[1])
    assert 0.0 <= u.min() and u.max() < 1.0, (u.min(), u.max())
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.std() - 12 ** -0.5) < 0.02, u.mean()
    assert np.all(np.isfinite(n)) and abs(n.mean()) < 0.06, n.mean()
    assert 0.93 < n.std() < 1.07, n.std()
    assert set(np.unique(b)) <= {0, 1} and abs(b.mean() - 0.3) < 0.03, b.mean()
    # The same seed draws the same numbers; each grid step and each seed its own.
    again = sample(jnp.array([7], jnp.int32))[3]
    np.testing.assert_array_equal(again, bits)
    blocks = bits.reshape(STEPS, -1)
    assert len({row.tobytes() for row in blocks}) == STEPS, "grid steps share a stream"
    other = np.asarray(sample(jnp.array([8], jnp.int32))[3])
    assert np.mean(other == bits) < 0.01, "another seed draws the same bits"
    print("stateful_random_ok: output matches")
