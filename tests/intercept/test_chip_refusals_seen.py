"""What a real TPU v5e refused in session 28's probes (hardware/chip/v5e/numerics.json,
hardware/probes/numerics.py), refused the same way by a run with the chip's compile: a
`compile-error` finding, and the exception class the chip raised, in the program.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl

from pallas_check.config import Config
from pallas_check.intercept.session import Session
from pallas_check.tpu_compile.toolchain import libtpu_missing

SEEN = json.loads((Path(__file__).resolve().parents[2] / "hardware" / "chip" / "v5e"
                   / "numerics.json").read_text())["cases"]
X = np.ones((128, 128), np.float32)
B = X.astype(jnp.bfloat16)


def _dot(x, y, precision, out_dtype):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=precision,
                             preferred_element_type=out_dtype).astype(o_ref.dtype)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), out_dtype))(x, y)


def _unary(fn, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...])
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


CASES = {
    "kernel.f32.high": lambda: _dot(X, X, lax.Precision.HIGH, jnp.float32),
    "kernel.bf16_f32out.highest": lambda: _dot(B, B, lax.Precision.HIGHEST, jnp.float32),
    "kernel.bf16_bf16out.none": lambda: _dot(B, B, None, jnp.bfloat16),
    "kernel.unary.expm1": lambda: _unary(jnp.expm1, X),
    "kernel.unary.atan": lambda: _unary(jnp.arctan, X),
}


def test_every_refusal_the_chip_showed_is_here():
    assert sorted(k for k, v in SEEN.items()
                  if not v["ok"] and k.startswith("kernel.") and "_seen." not in k) == \
        sorted(CASES)


@pytest.mark.skipif(libtpu_missing() is not None, reason="needs libtpu")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_refusal_seen_on_the_chip_is_a_finding_and_raises_the_chips_class(case):
    session = Session(Config(chip_compile=True))
    with pytest.raises(Exception) as raised, session.install():
        jax.block_until_ready(CASES[case]())
    assert raised.type.__name__ == SEEN[case]["error_type"].rsplit(".", 1)[1]
    assert [f.kind.value for f in session.findings] == ["compile-error"]
