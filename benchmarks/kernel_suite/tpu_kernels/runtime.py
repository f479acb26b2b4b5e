"""Where the kernels run: on a TPU, or under one of JAX's interpreters.

The tests run only on a TPU (`on_tpu`), unless `TPU_KERNELS_INTERPRET` asks for one of
JAX's interpreters: `tpu` (JAX's TPU interpreter), `tpu-races` (the same with its race
detector), `hlo` (`interpret=True`). The conftest applies the choice to every kernel
call of a test (tests/conftest.py)."""

from __future__ import annotations

import os

import jax

INTERPRET_VARIABLE = "TPU_KERNELS_INTERPRET"
INTERPRET_MODES = ("tpu", "tpu-races", "hlo")


def interpret_mode() -> str | None:
    """The interpreter the environment asks for, or None (run on the chip)."""
    mode = os.environ.get(INTERPRET_VARIABLE, "").strip()
    if not mode:
        return None
    if mode not in INTERPRET_MODES:
        raise ValueError(f"{INTERPRET_VARIABLE}={mode!r}: one of {', '.join(INTERPRET_MODES)}")
    return mode


def on_tpu() -> bool:
    """Whether the default device is a TPU (its kind names one: "TPU v5 lite", ...)."""
    return "TPU" in jax.devices()[0].device_kind


def can_run() -> bool:
    """On a TPU, or under an interpreter the environment asked for."""
    return on_tpu() or interpret_mode() is not None
