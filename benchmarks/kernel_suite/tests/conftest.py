"""Every test's kernel calls run on the chip, or under the interpreter that
`TPU_KERNELS_INTERPRET` names (tpu_kernels/runtime.py): `tpu` / `tpu-races` force JAX's
TPU interpreter around the test (races detected with `tpu-races`), `hlo` gives every
`pl.pallas_call` `interpret=True` (the vendored JAX kernels take no `interpret` argument
of their own, so the call itself is wrapped)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels import runtime


@contextlib.contextmanager
def _hlo_interpreter() -> Iterator[None]:
    original = pl.pallas_call

    def interpreted(*args: Any, **kwargs: Any) -> Any:
        kwargs["interpret"] = True
        return original(*args, **kwargs)

    pl.pallas_call = interpreted
    try:
        yield
    finally:
        pl.pallas_call = original


@pytest.fixture(autouse=True)
def interpret_mode() -> Iterator[str | None]:
    mode = runtime.interpret_mode()
    if mode in ("tpu", "tpu-races"):
        params = pltpu.InterpretParams(detect_races=mode == "tpu-races",
                                       dma_execution_mode="on_wait")
        with pltpu.force_tpu_interpret_mode(params):
            yield mode
    elif mode == "hlo":
        with _hlo_interpreter():
            yield mode
    else:
        yield mode
