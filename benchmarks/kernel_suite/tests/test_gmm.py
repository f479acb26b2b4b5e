"""The vendored grouped matmuls (megablox gmm and tgmm): rows of lhs in groups, each
group multiplied by its own rhs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import runtime, vendored

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


def _bf16_exact(key, shape):
    return jax.random.normal(key, shape).astype(jnp.bfloat16).astype(jnp.float32)


def _gmm_reference(lhs, rhs, group_sizes):
    ends = np.cumsum(np.asarray(group_sizes))
    out, start = [], 0
    for g, end in enumerate(ends):
        out.append(np.asarray(lhs[start:end], np.float64) @ np.asarray(rhs[g], np.float64))
        start = end
    return np.concatenate(out)


@pytest.mark.parametrize("group_sizes", [(64, 64, 0, 128), (10, 100, 30, 116)])
def test_gmm(group_sizes):
    m, k, n = 256, 256, 128
    keys = jax.random.split(jax.random.key(sum(group_sizes[:2])), 2)
    lhs, rhs = _bf16_exact(keys[0], (m, k)), _bf16_exact(keys[1], (4, k, n))
    sizes = jnp.asarray(group_sizes, jnp.int32)
    np.testing.assert_allclose(vendored.gmm(lhs, rhs, sizes),
                               _gmm_reference(lhs, rhs, sizes), rtol=2e-2, atol=2e-1)


def test_tgmm():
    m, k, n = 128, 128, 128
    keys = jax.random.split(jax.random.key(5), 2)
    lhs, grad = _bf16_exact(keys[0], (m, k)), _bf16_exact(keys[1], (m, n))
    sizes = jnp.asarray([32, 0, 96], jnp.int32)
    got = vendored.tgmm(lhs, grad, sizes, num_groups=3)
    ends = np.cumsum(np.asarray(sizes))
    starts = ends - np.asarray(sizes)
    want = np.stack([np.asarray(lhs[s:e], np.float64).T @ np.asarray(grad[s:e], np.float64)
                     for s, e in zip(starts, ends)])
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-1)
