"""The host call (pallas_check/hostcall.py): the engine gets XLA's own buffers, no copies.

A checked call on one CPU device is an XLA FFI custom call whose operands reach the
handler as read-only views of XLA's buffers and whose outputs are simulated in the call's
result buffers; a kernel that writes its input works on a copy (the user's array is never
altered); an executable that outlives its session fails with a clear error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_check import intercept
from pallas_check.engine import kernel as engine_kernel


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _double(x):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(_double_kernel, grid=(x.shape[0] // 8,), in_specs=[spec],
                          out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _address(array) -> int:
    return array.__array_interface__["data"][0]


def test_operands_are_xla_buffers_and_results_are_filled_in_place():
    seen = {}

    def handler(params, operands, device, mesh_axes, results=None):
        seen["operands"] = [(_address(o), o.flags.writeable) for o in operands]
        seen["results"] = [_address(r) for r in results]
        results[0][...] = operands[0] + 1.0
        return results

    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    with intercept.intercepted(handler, fills_results=True):
        y = jax.block_until_ready(jax.jit(_double)(x))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x) + 1.0)
    assert seen["operands"] == [(x.unsafe_buffer_pointer(), False)]
    assert seen["results"] == [y.unsafe_buffer_pointer()]


def test_engine_simulates_the_output_in_the_result_buffer(check, monkeypatch):
    original = engine_kernel.run_call_devices
    addresses = {}

    def observed(*args, **kwargs):
        result = original(*args, **kwargs)
        addresses["results"] = [_address(r) for r in kwargs["results"]]
        addresses["outputs"] = [_address(o) for o in result.outputs[0]]
        return result

    monkeypatch.setattr(engine_kernel, "run_call_devices", observed)
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    checked = check(jax.jit(_double), x)
    assert checked.findings == []
    np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(x) * 2.0)
    assert addresses["outputs"] == addresses["results"]
    assert addresses["results"] == [checked.value.unsafe_buffer_pointer()]


def test_a_kernel_writing_its_aliased_input_never_alters_the_users_array(check):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 3.0

    def triple_in_place(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              input_output_aliases={0: 0})(x)

    x = jnp.full((8, 128), 2.0, jnp.float32)
    before = np.array(x)
    checked = check(jax.jit(triple_in_place), x)
    assert checked.findings == []
    np.testing.assert_array_equal(np.asarray(checked.value), before * 3.0)
    np.testing.assert_array_equal(np.asarray(x), before)


def test_an_executable_outliving_its_session_fails_clearly():
    def handler(params, operands, device, mesh_axes):
        return [np.asarray(operands[0]) * 2.0]

    x = jnp.ones((8, 128), jnp.float32)
    with intercept.intercepted(handler):
        compiled = jax.jit(_double).lower(x).compile()
        np.testing.assert_array_equal(np.asarray(compiled(x)), 2.0)
    with pytest.raises(Exception, match="lowered by a pallas-check session that has ended"):
        jax.block_until_ready(compiled(x))


def test_a_failing_handler_fails_the_call_with_its_message():
    def handler(params, operands, device, mesh_axes):
        raise ValueError("the handler's own words")

    heard = []
    x = jnp.ones((8, 128), jnp.float32)
    with intercept.handler_failures(heard.append), intercept.intercepted(handler):
        with pytest.raises(Exception, match="ValueError: the handler's own words"):
            jax.block_until_ready(jax.jit(_double)(x))
    assert [type(e).__name__ for e in heard] == ["ValueError"]
