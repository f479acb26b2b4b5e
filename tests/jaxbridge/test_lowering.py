"""jaxbridge/lowering.py: the pallas_call lowering patched, and with it a `pl.kernel` /
`core_map` kernel's. Off a TPU JAX lowers such a kernel as a pallas_call (its fallback),
which the patch reaches; on a TPU JAX's own mpmd_map rule builds the Mosaic module without
pallas_call's lowering, so the native modes (`record`, `diff --native`) patch that rule
too. JAX lowers for a TPU on any machine (`lowering_platforms=("tpu",)`), which is how
this is tested without one."""

from __future__ import annotations

import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pallas_check.intercept import patched_lowering
from pallas_check.intercept.patched_lowering import intercepted
from pallas_check.jaxbridge import lowering

ROOT = Path(__file__).resolve().parents[2]


def _double():
    return runpy.run_path(str(ROOT / "samples" / "core_map_race_ok.py"))["double"]


def _tpu_text(fn, x) -> str:
    return jax.jit(fn).trace(x).lower(lowering_platforms=("tpu",)).as_text()


def test_a_mesh_kernel_lowered_for_a_tpu_reaches_the_native_handler(monkeypatch):
    # The host callback itself needs a TPU client to be emitted: stood in for by a
    # function that keeps what it was given and hands the chip's outputs on.
    callbacks = []

    def host_call(host, result_shapes, *args):
        callbacks.append((host, result_shapes))
        return list(args[-len(result_shapes):])  # the hardware's outputs, as they are

    monkeypatch.setattr(patched_lowering, "_host_call", host_call)
    seen = []

    def handler(params, operands, device=0, mesh_axes=(), native=None):
        seen.append((params, [np.asarray(x) for x in operands], list(native)))
        return native

    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    with intercepted(handler, mode="alongside"):
        text = _tpu_text(_double(), x)
    assert "tpu_custom_call" in text  # the kernel as JAX lowers it for the chip
    ((host, shapes),) = callbacks
    assert [(s.shape, s.dtype) for s in shapes] == [((16, 128), jnp.float32)]
    # What the callback does with the chip's outputs at run time: the call as a
    # pallas_call over the mesh (the one `run` simulates), its operands and the outputs.
    chip = np.asarray(x) * 2
    (given,) = host(np.int32(0), np.asarray(x), chip)
    np.testing.assert_array_equal(given, chip)
    ((params, operands, native),) = seen
    assert params["jaxpr"].debug_info.func_name == "double_kernel"
    assert params["mesh"] is not None and params["mesh"].shape == {"core": 2}
    np.testing.assert_array_equal(operands[0], np.asarray(x))
    np.testing.assert_array_equal(native[0], chip)


def test_without_the_hardware_patch_a_tpu_never_lowers_it_as_a_pallas_call():
    # Why the native modes patch mpmd_map's rule: the pallas_call rule alone is not asked.
    asked = []

    def rule(ctx, *nodes, **params):  # pragma: no cover - never reached on a TPU
        asked.append(params)
        raise AssertionError("reached")

    saved = lowering.patch_pallas_call_lowering(rule)
    try:
        text = _tpu_text(_double(), jnp.zeros((16, 128), jnp.float32))
    finally:
        lowering.restore_pallas_call_lowering(saved)
    assert asked == [] and "tpu_custom_call" in text
