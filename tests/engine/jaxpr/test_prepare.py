"""engine/jaxpr/ahead.py `prepare`: a kernel's segments compiled ahead (while the chip's
compile of the call runs in its worker, intercept/chip.py), including those of a loop body
nested in it, so that the call's own evaluation compiles none of them and computes what
it would have."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import pallas_check
from pallas_check.engine.jaxpr import ahead

from _jax_events import BACKEND_COMPILE, events



def _kernel(x_ref, o_ref):
    # Arithmetic at the top and inside a loop body that reads and writes the output (a
    # nested jaxpr the engine evaluates as a program of its own).
    o_ref[...] = jnp.tanh(x_ref[...] * 0.37) + 1.25

    def step(i, carry):
        acc = o_ref[...]
        o_ref[...] = acc * 0.5 + jnp.exp(-jnp.abs(acc)) + i.astype(jnp.float32)
        return carry

    jax.lax.fori_loop(0, 3, step, 0)


def _reference(x: np.ndarray) -> np.ndarray:
    acc = np.tanh(x * 0.37) + 1.25
    for i in range(3):
        acc = acc * 0.5 + np.exp(-np.abs(acc)) + i
    return acc


def _compiled_names(fn):
    with events(BACKEND_COMPILE) as names:
        result = fn()
    return result, names


def test_prepared_segments_are_not_compiled_again_at_the_call(tmp_path, monkeypatch):
    monkeypatch.setenv("PALLAS_CHECK_CACHE_DIR", str(tmp_path / "cache"))  # nothing known
    x = np.linspace(-3, 3, 8 * 128, dtype=np.float32).reshape(8, 128)
    call = pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    closed = jax.make_jaxpr(call)(x)
    [eqn] = [e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call"]
    prepared, names = _compiled_names(lambda: ahead.prepare(eqn.params["jaxpr"], False))
    assert prepared >= 2, prepared  # the body's segment and the loop body's
    assert names.count("jit(run)") == prepared
    again, _ = _compiled_names(lambda: ahead.prepare(eqn.params["jaxpr"], False))
    assert again == 0

    def checked():
        # (in the arithmetic `prepare` ran in: segments are kept per arithmetic)
        with pallas_check.checking(project=False, races=False, chip_compile=False,
                                   tier="engine", chip_arithmetic=False) as run:
            out = np.asarray(jax.jit(call)(x))
        return out, run

    (out, run), names = _compiled_names(checked)
    assert "jit(run)" not in names, names
    assert [c.kernel for c in run.calls] == ["_kernel"] and not run.findings
    np.testing.assert_allclose(out, _reference(x), rtol=1e-5, atol=1e-5)
