"""The host callback's operands (pallas_check/intercept/hostcall.py, intercept/patched_lowering.py).

On one CPU device a checked call's operands reach the handler as read-only views of XLA's
own buffers (lent, not copied) and the engine simulates the outputs in the buffers the
script gets back; a kernel that writes its input works on a copy (the user's array is
never altered); an executable that outlives its session fails with a
clear error; a handler's exception fails the call with its message.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_check.intercept import hostcall
from pallas_check.intercept import patched_lowering as intercept


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _double(x):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(_double_kernel, grid=(x.shape[0] // 8,), in_specs=[spec],
                          out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _address(array) -> int:
    return array.__array_interface__["data"][0]


def test_operands_are_lent_xla_buffers_not_copies():
    seen = []

    def handler(params, operands, device, mesh_axes):
        seen.append([(_address(o), o.flags.writeable, o.shape) for o in operands])
        return [np.asarray(operands[0]) + 1.0]

    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    with intercept.intercepted(handler):
        y = jax.block_until_ready(jax.jit(_double)(x))
        # An intermediate of the same computation is lent too, and still alive.
        z = jax.block_until_ready(jax.jit(lambda v: _double(v * 3.0) - 1.0)(x))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x) + 1.0)
    np.testing.assert_array_equal(np.asarray(z), np.asarray(x) * 3.0)
    assert seen[0] == [(x.unsafe_buffer_pointer(), False, (16, 128))]
    assert seen[1][0][1:] == (False, (16, 128))
    assert hostcall._lent == {}  # every ticket was taken


def test_engine_simulates_the_outputs_in_the_calls_own_result_buffers(check, monkeypatch):
    from pallas_check.engine.call import explore

    original = explore.run_call_devices
    addresses = {}

    def observed(*args, **kwargs):
        result = original(*args, **kwargs)
        addresses["results"] = [_address(r) for r in kwargs["results"]]
        addresses["outputs"] = [_address(o) for o in result.outputs[0]]
        return result

    monkeypatch.setattr(explore, "run_call_devices", observed)
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    checked = check(jax.jit(_double), x)
    assert checked.findings == []
    np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(x) * 2.0)
    # The engine wrote the outputs where the script finds them: nothing was copied.
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
    assert hostcall._lent == {}  # the failed call's ticket was given back
