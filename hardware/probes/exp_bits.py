"""The chip's exp, exp2 and division bit for bit, densely enough to find their algorithm.

Why: after session 32 the simulation's flash attention still differs from a v5e in a few
elements, where the chip's `exp` (up to 64 ulps from the correctly rounded value, 1024
samples in chip/v5e/unary.npz) rounds a bfloat16 MXU operand the other way. To compute
what the chip computes, the simulation needs the chip's `exp` itself. This probe records:

- `exp2` of every multiple of 2^-21 in [0, 1) and in (-1, 0] (the range-reduced argument
  of any exp2 algorithm), and of a few of them shifted by whole numbers (how the integer
  part is handled), and of random arguments over the whole float32 range;
- `exp` of every multiple of 2^-21 in (-1, 0], of random arguments in [-88, 88], and
  `exp2(x * float32(log2 e))` of the same arguments (is exp the exp2 of a float32
  product?);
- every bfloat16 bit pattern through exp, exp2, log, tanh, logistic, sqrt, rsqrt,
  reciprocal, sin, cos, erf, log1p, in bfloat16 and in float32 of the same value (is a
  bfloat16 function the float32 one rounded?);
- float32 division `a / b`, `1 / b` and `a * (1 / b)` on random operands.

All in Pallas kernels (Mosaic; XLA:TPU's results were identical in session 28). Results:
`$OUT/exp_bits_*.npz` (six files; float32 outputs, uint16 for bfloat16), `$OUT/exp_bits.json`
(inputs' digests, cases taken or refused). Inputs are made from fixed formulas and seeds
(`inputs()`), so the analysis remakes them from this file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call  # noqa: E402

LOG2E = np.float32(1.4426950408889634)
ROWS = 1024


def inputs() -> dict[str, np.ndarray]:
    """Every input of the probe, remade identically by the analysis."""
    k = np.arange(1 << 21, dtype=np.float64)
    grid = (k / (1 << 21)).astype(np.float32)
    small = (np.arange(1 << 14, dtype=np.float64) / (1 << 14)).astype(np.float32)
    rng = np.random.default_rng(20261207)
    wide = rng.uniform(-126.0, 128.0, 1 << 18).astype(np.float32)
    exp_wide = rng.uniform(-88.0, 88.0, 1 << 20).astype(np.float32)
    bits = np.arange(1 << 16, dtype=np.uint32)
    bf16_all = (bits << 16).view(np.float32)
    a = rng.standard_normal(1 << 20).astype(np.float32) * np.float32(3.0)
    b = (rng.standard_normal(1 << 20) * np.exp(rng.uniform(-8, 8, 1 << 20))).astype(np.float32)
    shifts = np.concatenate([small + np.float32(n) for n in range(-4, 5)]).astype(np.float32)
    return {"grid_pos": grid, "grid_neg": -grid, "shifts": shifts, "wide": wide,
            "exp_wide": exp_wide, "bf16_all": bf16_all, "div_a": a, "div_b": b}


def _shape(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, ROWS)


def elementwise(fn: Callable[..., Any], *xs: np.ndarray) -> np.ndarray:
    """fn over equally shaped flat arrays, in a kernel with blocks of 256 x 1024."""
    shaped = [_shape(x) for x in xs]
    rows = shaped[0].shape[0]
    block = min(rows, 256)
    spec = pl.BlockSpec((block, ROWS), lambda i: (i, 0))

    def kernel(*refs: Any) -> None:
        *ins, out = refs
        out[...] = fn(*(r[...] for r in ins)).astype(out.dtype)

    out_dtype = jnp.asarray(shaped[0][:1, :1]).dtype
    f = call(kernel, out_shape=jax.ShapeDtypeStruct(shaped[0].shape, out_dtype),
             grid=(rows // block,), in_specs=[spec] * len(xs), out_specs=spec)
    return np.asarray(jax.jit(f)(*shaped)).reshape(-1)


BF16_FUNCTIONS: dict[str, Callable[[Any], Any]] = {
    "exp": jnp.exp, "exp2": jnp.exp2, "log": jnp.log, "tanh": jnp.tanh,
    "logistic": jax.nn.sigmoid, "sqrt": jnp.sqrt, "rsqrt": jax.lax.rsqrt,
    "recip": lambda v: 1 / v, "sin": jnp.sin, "cos": jnp.cos,
    "erf": jax.scipy.special.erf, "log1p": jnp.log1p,
}


def main() -> None:
    out = Path(os.environ.get("OUT", "hwout"))
    out.mkdir(parents=True, exist_ok=True)
    x = inputs()
    facts: dict[str, Any] = {
        "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
        "inputs": {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in x.items()},
        "cases": {}}
    files: dict[str, dict[str, np.ndarray]] = {}

    def case(file: str, key: str, fn: Callable[[], np.ndarray]) -> None:
        started = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - what the chip said is the finding
            facts["cases"][key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                                   "traceback": traceback.format_exc()[-2000:]}
            print(f"{key}: {type(exc).__name__}", flush=True)
        else:
            if value.dtype == jnp.bfloat16:
                value = value.view(np.uint16)
            files.setdefault(file, {})[key] = value
            facts["cases"][key] = {"ok": True, "seconds": round(time.perf_counter() - started, 2)}
            print(f"{key}: ok {facts['cases'][key]['seconds']} s", flush=True)
            np.savez_compressed(out / f"exp_bits_{file}.npz", **files[file])
        (out / "exp_bits.json").write_text(json.dumps(facts, indent=1))

    case("exp2_pos", "exp2.grid_pos", functools.partial(elementwise, jnp.exp2, x["grid_pos"]))
    case("exp2_neg", "exp2.grid_neg", functools.partial(elementwise, jnp.exp2, x["grid_neg"]))
    case("exp2_pos", "exp2.shifts", functools.partial(elementwise, jnp.exp2, x["shifts"]))
    case("exp2_pos", "exp2.wide", functools.partial(elementwise, jnp.exp2, x["wide"]))
    case("exp_neg", "exp.grid_neg", functools.partial(elementwise, jnp.exp, x["grid_neg"]))
    case("exp_neg", "exp2_log2e.grid_neg",
         functools.partial(elementwise, lambda v: jnp.exp2(v * LOG2E), x["grid_neg"]))
    case("exp_wide", "exp.exp_wide", functools.partial(elementwise, jnp.exp, x["exp_wide"]))
    case("exp_wide", "exp2_log2e.exp_wide",
         functools.partial(elementwise, lambda v: jnp.exp2(v * LOG2E), x["exp_wide"]))
    finite = x["bf16_all"].copy()
    finite[~np.isfinite(finite)] = 0.0
    xb = finite.astype(jnp.bfloat16)
    for name, fn in BF16_FUNCTIONS.items():
        case("bf16", f"bf16.{name}", functools.partial(elementwise, fn, xb))
        case("bf16", f"f32_of_bf16.{name}", functools.partial(elementwise, fn, finite))
    case("div", "div.a_over_b", functools.partial(elementwise, lambda p, q: p / q,
                                                  x["div_a"], x["div_b"]))
    case("div", "div.one_over_b", functools.partial(elementwise, lambda q: 1 / q, x["div_b"]))
    case("div", "div.a_times_recip",
         functools.partial(elementwise, lambda p, q: p * (1 / q), x["div_a"], x["div_b"]))
    print("done", sum(c["ok"] for c in facts["cases"].values()), "of", len(facts["cases"]))


if __name__ == "__main__":
    main()
