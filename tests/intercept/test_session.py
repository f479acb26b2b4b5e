"""The basic path: a kernel intercepted eagerly, under jit and vmap, outputs correct."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def _add(x, y):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + 2 * y_ref[...]

    return pl.pallas_call(
        kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))] * 2,
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def test_eager_jit_vmap(check):
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    y = x + 1
    r = check(lambda: (_add(x, y), jax.jit(_add)(x, y),
                       jax.vmap(_add)(jnp.stack([x, y]), jnp.stack([y, x]))))
    eager, jitted, batched = r.value
    np.testing.assert_allclose(eager, x + 2 * y)
    np.testing.assert_allclose(jitted, x + 2 * y)
    np.testing.assert_allclose(batched[1], y + 2 * x)
    assert r.findings == []
    assert len(r.session.calls) == 3


def test_cli_clean_sample(cli, sample):
    result = cli("run", sample("add_ok.py"))
    assert result.exit_code == 0
    assert result.report["findings"] == []
    assert result.report["calls"][0]["kernel"] == "add_kernel"
