"""Control flow inside kernels (cond, switch, while, scan, fori) with refs read and written
in the bodies, and skip_floats, each checked three ways (see tests/_three_ways.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config

from _three_ways import F32, I32, run_checked, arange


# ---------------------------------------------------------------------------------------
# Control flow inside kernels, with refs read and written in the bodies.

def _control_kernel(kind):
    def kernel(n_ref, x_ref, o_ref, s_ref):
        n = n_ref[0]
        if kind == "cond":
            def yes():
                o_ref[...] = x_ref[...] * 2

            def no():
                o_ref[...] = x_ref[...] - 1

            lax.cond(n > 2, yes, no)
            lax.cond(pl.program_id(0) == 1, lambda: o_ref.__setitem__(
                (0, slice(None)), jnp.zeros((128,), F32)), lambda: None)
            return
        o_ref[...] = jnp.zeros_like(o_ref)
        if kind == "while":
            def cond(c):
                return c[0] < n

            def body(c):
                i, s = c
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] * i.astype(F32) + s
                return i + 1, s + 1.0

            lax.while_loop(cond, body, (jnp.int32(0), jnp.float32(0)))
        elif kind == "scan":
            def step(carry, row):
                i, acc = carry
                acc = acc + x_ref[pl.ds(i, 1), :]
                o_ref[pl.ds(i, 1), :] = acc
                return (i + 1, acc), row * 2

            (_, acc), ys = lax.scan(step, (jnp.int32(0), jnp.zeros((1, 128), F32)),
                                    jnp.arange(8, dtype=F32))
            o_ref[pl.ds(7, 1), :] = acc + jnp.sum(ys)
        elif kind in ("fori-static", "fori-dynamic"):
            upper = 8 if kind == "fori-static" else n

            def body(i, acc):
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] + acc
                return acc + o_ref[pl.ds(i, 1), :]

            lax.fori_loop(0, upper, body, jnp.zeros((1, 128), F32))
        elif kind == "fori-unrolled":
            def body(i, carry):
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] * 3
                return carry

            lax.fori_loop(0, 8, body, 0, unroll=True)
        elif kind == "jit":
            @jax.jit
            def inner(a, b):
                return jnp.sin(a) * b + 1

            o_ref[...] = inner(x_ref[...], n.astype(F32))
        elif kind == "jit-ref":
            @jax.jit
            def inner(r, rows):
                r[pl.ds(2, 4), :] = rows * 3

            inner(o_ref, x_ref[pl.ds(2, 4), :])
        elif kind == "while-ref-cond":  # the loop condition reads a ref the body writes
            s_ref[0] = 0

            def body(carry):
                i = s_ref[0]
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] * 2
                s_ref[0] = i + 1
                return carry

            lax.while_loop(lambda c: s_ref[0] < n, body, 0)
        elif kind == "switch":
            branches = [lambda j=j: o_ref.__setitem__((pl.ds(j, 1), slice(None)),
                                                      x_ref[pl.ds(j, 1), :] + j)
                        for j in range(3)]
            lax.switch(n % 3, branches)  # dynamic index: 5 % 3 -> branch 2
            for j in range(2):
                lax.switch(j, branches)
        elif kind == "pl-loop":
            @pl.loop(1, 8, step=2)
            def _(i):
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] - 1
    return kernel


def _control_reference(kind, n, x):
    x = np.asarray(x, np.float64)
    o = np.zeros_like(x)
    if kind == "cond":
        o = x * 2 if n > 2 else x - 1
        o = np.tile(o, (2, 1))
        o[8] = 0
        return o
    if kind == "while":
        for i in range(n):
            o[i] = x[i] * i + i
    elif kind == "scan":
        acc = np.zeros(128)
        for i in range(8):
            acc = acc + x[i]
            o[i] = acc
        o[7] = acc + 2 * sum(range(8))
    elif kind in ("fori-static", "fori-dynamic"):
        acc = np.zeros(128)
        for i in range(8 if kind == "fori-static" else n):
            o[i] = x[i] + acc
            acc = acc + o[i]
    elif kind == "fori-unrolled":
        o = x * 3
    elif kind == "jit":
        o = np.sin(x) * n + 1
    elif kind == "jit-ref":
        o[2:6] = x[2:6] * 3
    elif kind == "while-ref-cond":
        o[:n] = x[:n] * 2
    elif kind == "switch":
        o[:3] = x[:3] + np.arange(3)[:, None]
    elif kind == "pl-loop":
        o[1:8:2] = x[1:8:2] - 1
    return np.tile(o, (2, 1))


@pytest.mark.parametrize("kind", ["cond", "switch", "while", "while-ref-cond", "scan",
                                  "fori-static", "fori-dynamic", "fori-unrolled", "pl-loop",
                                  "jit", "jit-ref"])
def test_control_flow(check, kind):
    x = arange((8, 128), mod=17) / 8
    n = jnp.array([5], I32)

    def fn(n, x, interpret=False):
        return pl.pallas_call(
            _control_kernel(kind), grid=(2,),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                      pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
            scratch_shapes=[pltpu.SMEM((1,), I32)], interpret=interpret)(n, x)

    # JAX's HLO interpreter never ends a while_loop whose condition reads a ref that the
    # body writes (it loops forever on this kernel), so that one is checked against numpy.
    run_checked(check, fn, n, x, reference=_control_reference(kind, 5, x), rtol=1e-5,
                oracle=kind != "while-ref-cond")


# ---------------------------------------------------------------------------------------
# skip_floats: int-only control flow stays exact; float results are inf.

def test_skip_floats(check):
    n = jnp.arange(16 * 128, dtype=I32).reshape(16, 128) % 9 + 1
    x = arange((16, 128))

    def fn(n, x, interpret=False):
        def kernel(n_ref, x_ref, steps_ref, f_ref):
            def cond(c):
                v, _ = c
                return jnp.any(v > 1)

            def body(c):
                v, s = c
                done = v <= 1
                nv = jnp.where(v % 2 == 0, v // 2, 3 * v + 1)
                return jnp.where(done, v, nv), s + jnp.where(done, 0, 1)

            _, steps = lax.while_loop(cond, body, (n_ref[...], jnp.zeros_like(n_ref)))
            steps_ref[...] = steps
            f_ref[...] = x_ref[...] * 2 + 1

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(kernel, grid=(2,), in_specs=[spec, spec],
                              out_specs=[spec, spec],
                              out_shape=[jax.ShapeDtypeStruct(n.shape, I32),
                                         jax.ShapeDtypeStruct(x.shape, F32)],
                              interpret=interpret)(n, x)

    def collatz(v):
        s = 0
        while v > 1:
            v, s = (v // 2 if v % 2 == 0 else 3 * v + 1), s + 1
        return s

    steps = np.vectorize(collatz)(np.asarray(n)).astype(np.int32)
    r = check(fn, n, x, config=Config(skip_floats=True))
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == []
    np.testing.assert_array_equal(r.value[0], steps)
    assert np.all(np.isinf(np.asarray(r.value[1])))
    # without skip_floats both are right, and agree with the oracle
    run_checked(check, fn, n, x, reference=[steps, x * 2 + 1])
