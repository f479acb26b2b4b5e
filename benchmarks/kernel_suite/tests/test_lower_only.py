"""Tests that never run a kernel: they lower, trace or inspect jitted functions that
contain kernels (donation, output signatures, what a jaxpr holds), as a repository checks
its wrappers' contracts."""

import jax
import jax.numpy as jnp
import pytest

from tpu_kernels import elementwise, kv_cache_update, matmul, runtime, softmax

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


def test_cache_update_donates_the_cache():
    cache = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    new = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    slots = jax.ShapeDtypeStruct((8,), jnp.int32)
    lowered = kv_cache_update.write_tokens.lower(cache, new, slots)
    donated = [arg.donated for arg in jax.tree.leaves(lowered.args_info)]
    assert donated == [True, False, False]
    assert lowered.out_info.shape == (256, 128)


@pytest.mark.parametrize("m,n,k", [(128, 128, 128), (256, 512, 128)])
def test_matmul_signature(m, n, k):
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    y = jax.ShapeDtypeStruct((k, n), jnp.bfloat16)
    out = jax.eval_shape(matmul.matmul, x, y)
    assert (out.shape, out.dtype) == ((m, n), jnp.bfloat16)
    lowered = matmul.matmul.lower(x, y)
    assert lowered.out_info.shape == (m, n)


def test_wrappers_are_one_kernel_each():
    x = jnp.zeros((64, 128), jnp.float32)
    for fn, args in ((elementwise.add, (x, x)), (softmax.softmax, (x,)),
                     (elementwise.scaled_gelu, (x,))):
        jaxpr = jax.make_jaxpr(fn)(*args)
        text = str(jaxpr)
        assert text.count("pallas_call") == 1, text


def test_jit_of_a_model_step_lowers():
    def step(x, w, gamma):
        from tpu_kernels import layernorm
        h = matmul.matmul(x, w)
        return layernorm.rmsnorm(h, gamma)

    x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    gamma = jax.ShapeDtypeStruct((128,), jnp.float32)
    lowered = jax.jit(step).lower(x, w, gamma)
    assert lowered.out_info.shape == (128, 128)
    assert "func.func public @main" in lowered.as_text()
