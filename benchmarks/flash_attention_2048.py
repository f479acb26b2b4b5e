"""The shipped flash attention with 2048-wide blocks on (1, 8, 4096, 128) bf16: a size
that builds for v6e and v7x and overflows v5e's scoped VMEM (benchmarks/compile.py runs it
under `pallas-check compile` only: simulating it is not the point)."""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import flash_attention as fa


def attention(q, k, v):
    blocks = fa.BlockSizes(block_q=2048, block_k_major=2048, block_k=2048, block_b=1)
    return fa.flash_attention(q, k, v, block_sizes=blocks)


if __name__ == "__main__":
    q = k = v = jnp.zeros((1, 8, 4096, 128), jnp.bfloat16)
    print(jax.jit(attention)(q, k, v).shape)
