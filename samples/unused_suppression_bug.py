"""A suppression comment left behind after its bug was fixed.

The kernel once read past its block and the author silenced the finding with
`# pallas-check: ignore[out-of-bounds]`. The index was fixed since; the comment stayed and
would now hide a future out-of-bounds read on that line. pallas-check reports a comment
inside a checked kernel that matched nothing (like ruff's unused-noqa), so it gets removed.

Expected finding: kind=unused-suppression buffer= line=20
(no buffer: the finding is about the comment on line 20, not about memory)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def scale_kernel(x_ref, o_ref):
    # BUG: the stale suppression below matches no finding any more.
    x = x_ref[...]  # pallas-check: ignore[out-of-bounds]
    o_ref[...] = 2.0 * x


def scale(x):
    return pl.pallas_call(
        scale_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    np.testing.assert_allclose(jax.jit(scale)(x), 2.0 * x)
    print("unused_suppression_bug: output matches")
