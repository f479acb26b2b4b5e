"""Findings a team has accepted, suppressed in the code (see README, "Suppressions").

Three kernels with known defects, each silenced a different way:
- `window_kernel` reads past its block; `# pallas-check: ignore[out-of-bounds]` on that
  line suppresses that kind there (inline, by kind);
- `handshake_kernel` leaves a semaphore signalled; the comment on its `def` line
  suppresses that kind in the whole kernel (def-line);
- `shifted_kernel` reads past its block too; a bare `# pallas-check: ignore` on the line
  suppresses every kind there.
The run reports nothing that counts (exit 0) and says 3 findings were suppressed.

Expected suppressed: kind=out-of-bounds buffer=x_ref line=31 by=inline
Expected suppressed: kind=semaphore-leak buffer=sems line=40 by=def-line
Expected suppressed: kind=out-of-bounds buffer=x_ref line=45 by=inline
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SPEC = dict(
    in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
    out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
)


def window_kernel(x_ref, o_ref):
    row = pl.multiple_of(pl.program_id(0) * 8, 8)
    # Known: reads the next block at step 1 (a vendor quirk we keep for now).
    x = x_ref[pl.ds(row, 8), :]  # pallas-check: ignore[out-of-bounds]
    o_ref[...] = 2.0 * x


def handshake_kernel(x_ref, o_ref, sems):  # pallas-check: ignore[semaphore-leak]
    o_ref[...] = x_ref[...] * 3.0
    pl.semaphore_signal(sems.at[0])
    pl.semaphore_wait(sems.at[0])
    # Known: the consumer of this signal lives in the next kernel (not modelled here).
    pl.semaphore_signal(sems.at[1])


def shifted_kernel(x_ref, o_ref):
    row = pl.multiple_of(pl.program_id(0) * 8, 8)
    x = x_ref[pl.ds(row, 8), :]  # pallas-check: ignore
    o_ref[...] = x + 1.0


def run(x):
    a = pl.pallas_call(window_kernel, grid=(2,), **SPEC,
                       out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    b = pl.pallas_call(handshake_kernel, grid=(1,),
                       in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                       out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
                       scratch_shapes=[pltpu.SemaphoreType.REGULAR((2,))])(x[:8])
    c = pl.pallas_call(shifted_kernel, grid=(2,), **SPEC,
                       out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    return a, b, c


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    outputs = jax.block_until_ready(jax.jit(run)(x))
    print("suppressed_findings: ran", len(outputs), "kernels")
