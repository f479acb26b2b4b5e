"""A matmul family built the way training stacks write TPU kernels: a `pallas_call` over
HBM refs (`memory_space=pl.ANY`) whose body runs `pltpu.emit_pipeline` over small inner
blocks, and a `jax.custom_vjp` whose backward is two more calls of the same kernel.

The outer grid (cores, slabs) is ("parallel", "arbitrary"): each outer step owns a slab of
`slab` rows of x and of the output; the inner pipeline walks that slab's (N, K) blocks,
accumulating each output block over K in the block itself (zeroed at k == 0).

Run: pallas-check run --races samples/nested_pipeline_ok.py
Expected findings: none.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def nested_matmul_kernel(x_hbm, w_hbm, o_hbm, *, slab, block_k, block_n):
    """One outer step: o[rows] = x[rows] @ w through an inner pipeline of small blocks."""
    first_row = (pl.program_id(0) * pl.num_programs(1) + pl.program_id(1)) * slab
    rows = pl.ds(pl.multiple_of(first_row, slab), slab)
    k_blocks = x_hbm.shape[1] // block_k
    n_blocks = w_hbm.shape[1] // block_n

    def inner(x_ref, w_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)  # the inner pipeline's own k index
        def _zero():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], w_ref[...], precision="highest")

    pltpu.emit_pipeline(
        inner, grid=(n_blocks, k_blocks),
        in_specs=[pl.BlockSpec((slab, block_k), lambda n, k: (0, k)),
                  pl.BlockSpec((block_k, block_n), lambda n, k: (k, n))],
        out_specs=[pl.BlockSpec((slab, block_n), lambda n, k: (0, n))],
    )(x_hbm.at[rows], w_hbm, o_hbm.at[rows])


def nested_matmul(x, w, *, slab=128, block_k=128, block_n=128, cores=2, interpret=False):
    """x @ w; x's rows split over `cores` parallel outer steps, each of several slabs."""
    m, k = x.shape
    n = w.shape[1]
    slabs = m // (cores * slab)
    assert slabs * cores * slab == m and k % block_k == 0 and n % block_n == 0
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        functools.partial(nested_matmul_kernel, slab=slab, block_k=block_k,
                          block_n=block_n),
        grid=(cores, slabs),
        in_specs=[any_spec, any_spec], out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(x, w)


def make_linear(interpret=False, **blocks):
    """y = x @ w with a custom_vjp whose backward is two nested-pipeline matmuls."""
    mm = functools.partial(nested_matmul, interpret=interpret, **blocks)

    @jax.custom_vjp
    def linear(x, w):
        return mm(x, w)

    def forward(x, w):
        return mm(x, w), (x, w)

    def backward(residuals, g):
        x, w = residuals
        return mm(g, w.T), mm(x.T, g)  # dx = g w^T, dw = x^T g

    linear.defvjp(forward, backward)
    return linear


def make_loss_and_grad(interpret=False, **blocks):
    """One call computing the loss sum(tanh(x @ w)) and its gradient in x and w."""
    linear = make_linear(interpret, **blocks)

    def loss(x, w):
        return jnp.sum(jnp.tanh(linear(x, w)))

    return jax.value_and_grad(loss, argnums=(0, 1))


def reference_loss(x, w):
    return jnp.sum(jnp.tanh(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST)))


def operands(m, k, n):
    kx, kw = jax.random.split(jax.random.key(7))
    x = jax.random.normal(kx, (m, k), jnp.float32) / 8
    w = jax.random.normal(kw, (k, n), jnp.float32) / 8
    return x, w


if __name__ == "__main__":
    x, w = operands(128, 256, 256)
    blocks = dict(slab=32, block_k=128, block_n=128)  # outer grid (2, 2), inner (2, 2)
    value, (dx, dw) = jax.jit(make_loss_and_grad(**blocks))(x, w)
    want, (want_dx, want_dw) = jax.value_and_grad(reference_loss, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(value, want, rtol=1e-4)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-4, atol=1e-5)
    print("nested_pipeline_ok: output matches")
