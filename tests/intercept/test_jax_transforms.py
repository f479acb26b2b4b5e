"""JAX transformations around an intercepted pallas_call, each checked three ways (see
tests/_three_ways.py): vmap, jax.grad through a custom_vjp, and the user's own
interpret= (the call is still ours)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from _three_ways import F32, I32, _assert_close, run_checked, arange, pids_offset


# ---------------------------------------------------------------------------------------
# vmap of a pallas_call: program_id / num_programs see the grid without the batch axis,
# which the batching rule puts first; scalar prefetch and HBM operands batched too.

@pytest.mark.parametrize("kind", ["grid", "prefetch", "hbm-dma"])
def test_vmap(check, kind):
    xs = arange((3, 16, 256), mod=50)
    idxs = jnp.array([[1, 0], [0, 1], [1, 1]], I32)

    def one(x, idx, interpret=False):
        if kind == "grid":
            def kernel(x_ref, o_ref):
                o_ref[...] = x_ref[...] + pids_offset(2).astype(F32)

            spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
            return pl.pallas_call(kernel, grid=(2, 2), in_specs=[spec], out_specs=spec,
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  interpret=interpret)(x)
        if kind == "prefetch":  # batched scalar prefetch: JAX loops over the batch
            def kernel(s_ref, x_ref, o_ref):
                o_ref[...] = x_ref[...] + s_ref[pl.program_id(0)].astype(F32)

            grid_spec = pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(2,),
                in_specs=[pl.BlockSpec((8, 256), lambda i, s: (s[i], 0))],
                out_specs=pl.BlockSpec((8, 256), lambda i, s: (i, 0)))
            return pl.pallas_call(kernel, grid_spec=grid_spec,
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  interpret=interpret)(idx, x)

        # an HBM operand gains a squeezed batch dim: the kernel sees its batch's slice
        def kernel(x_hbm, o_ref, buf, sem):
            copy = pltpu.make_async_copy(x_hbm.at[pl.ds(8, 8)], buf, sem)
            copy.start()
            copy.wait()
            o_ref[...] = buf[...] * 2 + pl.program_id(0).astype(F32)

        return pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (0, i)),
                              out_shape=jax.ShapeDtypeStruct((8, 256), F32),
                              scratch_shapes=[pltpu.VMEM((8, 128), F32),
                                              pltpu.SemaphoreType.DMA],
                              interpret=interpret)(x[:, :128])

    def fn(xs, idxs, interpret=False):
        return jax.vmap(functools.partial(one, interpret=interpret))(xs, idxs)

    x = np.asarray(xs)
    if kind == "grid":
        idx = np.indices((16, 256))
        want = x + ((idx[0] // 8) * 10 + idx[1] // 128 + 4000)[None]
    elif kind == "prefetch":
        ix = np.asarray(idxs)
        want = np.stack([np.concatenate([x[b, 8 * ix[b, i]: 8 * ix[b, i] + 8] + ix[b, i]
                                         for i in range(2)]) for b in range(3)])
    else:
        want = np.concatenate([x[:, 8:16, :128] * 2, x[:, 8:16, :128] * 2 + 1], axis=2)
    run_checked(check, fn, xs, idxs, reference=want)


# ---------------------------------------------------------------------------------------
# jax.grad through a custom_vjp whose fwd and bwd are pallas_calls.

def _cube_call(x, interpret):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] ** 3

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, grid=(x.shape[0] // 8,), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret)(x)


def _cube_grad_call(x, g, interpret):
    def kernel(x_ref, g_ref, o_ref):
        o_ref[...] = 3 * x_ref[...] ** 2 * g_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, grid=(x.shape[0] // 8,), in_specs=[spec, spec],
                          out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret)(x, g)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def cube(x, interpret=False):
    return _cube_call(x, interpret)


cube.defvjp(lambda x, interpret: (_cube_call(x, interpret), x),
            lambda interpret, x, g: (_cube_grad_call(x, g, interpret),))


def test_grad_through_custom_vjp(check):
    x = arange((16, 128), mod=9) / 4 - 1

    def fn(x, interpret=False):
        return jax.jit(jax.grad(lambda x: jnp.sum(cube(x, interpret) * 2)))(x)

    run_checked(check, fn, x, reference=6 * x ** 2, calls=2, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# The user's own interpret= is ignored: the call is still ours.

@pytest.mark.parametrize("interpret", [True, "params"], ids=["True", "InterpretParams"])
def test_user_interpret_still_intercepted(check, interpret):
    if interpret == "params":
        interpret = pltpu.InterpretParams()
    x = arange((16, 128))
    r = check(lambda: _cube_call(x, interpret))
    assert r.session.engine_error is None
    assert r.findings == []
    assert len(r.session.calls) == 1
    _assert_close(r.value, x ** 3, rtol=1e-6)
