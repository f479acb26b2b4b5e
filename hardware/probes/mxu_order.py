"""How the v5e's MXU adds a product's float32 terms: order and precision of the sums.

Why: after session 33 (the chip's exp and division modelled) the kernel repository's
flash attention still differs from the chip in 25 elements, most likely through `q @ k^T`:
bfloat16 products are exact in float32, but the chip adds them in its own order (session
28's products, chip/v5e/matmul.npz: no simple order reproduced them). These products are
built to expose the order: every term 1 but one of 2**24 at position i (how many ones are
added before the big term absorbs them), every term 2**-24 but one 1 (whether small terms
meet each other first), mixed signs, and random operands, for contractions of 32 to 512,
in `jnp.dot` form and in `q @ k^T` form (`dot_general` contracting both last dims).

Also dense float32 grids of tanh, log, sqrt and rsqrt for later modelling.
Results: `$OUT/mxu_order.npz` (operands and outputs), `$OUT/functions.npz`,
`$OUT/mxu_order.json`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call  # noqa: E402

N = 128
BF16 = jnp.bfloat16


def product(x: np.ndarray, y: np.ndarray, transposed: bool) -> np.ndarray:
    """x (M, K) @ y (K, N) in a kernel, float32 result; `transposed`: y given as (N, K)
    and contracted on its last dimension (flash attention's `q @ k^T`)."""
    operand = y.T.copy() if transposed else y
    dims = (((1,), (1,)), ((), ())) if transposed else (((1,), (0,)), ((), ()))

    def kernel(x_ref: Any, y_ref: Any, o_ref: Any) -> None:
        o_ref[...] = lax.dot_general(x_ref[...], y_ref[...], dims,
                                     preferred_element_type=jnp.float32)

    out = call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], N), jnp.float32))
    return np.asarray(jax.jit(out)(x, operand))


def designs(k: int, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Operand pairs (x (8, k), y (k, 128)) in float32 holding bfloat16 values."""
    ones = np.ones((8, k), np.float32)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for offset in range(0, k, N):
        big = np.ones((k, N), np.float32)
        tiny = np.full((k, N), 2.0 ** -24, np.float32)
        for j in range(N):
            if offset + j < k:
                big[offset + j, j] = 2.0 ** 24
                tiny[offset + j, j] = 1.0
        out[f"big_at.{offset}"] = (ones, big)
        out[f"one_among_tiny.{offset}"] = (ones, tiny)
    # row r of x scales terms by 2**-r: the absorbed amount differs per row
    scaled = np.stack([np.full(k, 2.0 ** -r, np.float32) for r in range(8)])
    big = np.ones((k, N), np.float32)
    for j in range(N):
        big[(j * 7) % k, j] = 2.0 ** 20
        big[(j * 7 + 1 + j % 5) % k, j] = -(2.0 ** 20)
    out["cancel"] = (scaled, big)
    for seed in range(3):
        x = rng.standard_normal((8, k)).astype(BF16).astype(np.float32)
        y = rng.standard_normal((k, N)).astype(BF16).astype(np.float32)
        out[f"random.{seed}"] = (x, y)
    wide = (rng.standard_normal((8, k)) * np.exp(rng.uniform(-6, 6, (8, k)))).astype(BF16)
    out["random_wide"] = (wide.astype(np.float32),
                          (rng.standard_normal((k, N)) * np.exp(rng.uniform(-6, 6, (k, N))))
                          .astype(BF16).astype(np.float32))
    return out


def functions() -> dict[str, np.ndarray]:
    grid = np.arange(1 << 19, dtype=np.float64)
    inputs = {"tanh": (grid / (1 << 17)).astype(np.float32),
              "log": (1 + grid / (1 << 19)).astype(np.float32),
              "sqrt": (1 + 3 * grid / (1 << 19)).astype(np.float32),
              "rsqrt": (1 + 3 * grid / (1 << 19)).astype(np.float32)}
    fns: dict[str, Callable[[Any], Any]] = {"tanh": jnp.tanh, "log": jnp.log,
                                            "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt}
    out: dict[str, np.ndarray] = {}
    for name, x in inputs.items():
        shaped = x.reshape(-1, 1024)
        spec = pl.BlockSpec((256, 1024), lambda i: (i, 0))

        def kernel(x_ref: Any, o_ref: Any, fn: Callable[[Any], Any] = fns[name]) -> None:
            o_ref[...] = fn(x_ref[...])

        f = call(kernel, out_shape=jax.ShapeDtypeStruct(shaped.shape, jnp.float32),
                 grid=(shaped.shape[0] // 256,), in_specs=[spec], out_specs=spec)
        out[f"{name}.x"] = x
        out[f"{name}.chip"] = np.asarray(jax.jit(f)(shaped)).reshape(-1)
    return out


def flash_scores(arrays: dict[str, np.ndarray]) -> None:
    """`q @ k^T` of the kernel repository's flash attention calls that still differ from the
    chip (probes/flash_inputs_s33.npz: calls 26, 27, 33), float32 operands at the default
    precision as the shipped kernel has them, per head."""
    inputs = np.load(Path(__file__).resolve().parent / "flash_inputs_s33.npz")
    for c in (26, 27, 33):
        q, k = inputs[f"c{c}.q"], inputs[f"c{c}.k"]
        for h in range(q.shape[1]):
            arrays[f"scores.c{c}.h{h}"] = product_square(q[0, h], k[0, h])


def product_square(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    dims = (((1,), (1,)), ((), ()))

    def kernel(q_ref: Any, k_ref: Any, o_ref: Any) -> None:
        o_ref[...] = lax.dot_general(q_ref[...], k_ref[...], dims,
                                     preferred_element_type=jnp.float32)

    out = call(kernel, out_shape=jax.ShapeDtypeStruct((q.shape[0], k.shape[0]), jnp.float32))
    return np.asarray(jax.jit(out)(q, k))


def main() -> None:
    out = Path(os.environ.get("OUT", "hwout"))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(33)
    arrays: dict[str, np.ndarray] = {}
    facts: dict[str, Any] = {"device_kind": jax.devices()[0].device_kind, "cases": {}}
    for k in (32, 64, 128, 256, 512):
        for name, (x, y) in designs(k, rng).items():
            arrays[f"k{k}.{name}.x"] = x
            arrays[f"k{k}.{name}.y"] = y
            for transposed in (False, True):
                key = f"k{k}.{name}.{'qkT' if transposed else 'dot'}"
                for dtype, tag in ((BF16, ""), (jnp.float32, ".f32")):
                    try:
                        arrays[key + tag] = product(x.astype(dtype), y.astype(dtype), transposed)
                        facts["cases"][key + tag] = "ok"
                    except Exception as exc:  # noqa: BLE001 - the chip's answer
                        facts["cases"][key + tag] = f"{type(exc).__name__}: {exc}"[:500]
                        print(key + tag, traceback.format_exc()[-500:], flush=True)
        np.savez_compressed(out / "mxu_order.npz", **arrays)
        (out / "mxu_order.json").write_text(json.dumps(facts, indent=1))
        print("k", k, "done", flush=True)
    try:
        flash_scores(arrays)
        np.savez_compressed(out / "mxu_order.npz", **arrays)
    except Exception:  # noqa: BLE001 - recorded in the log
        print(traceback.format_exc()[-1500:], flush=True)
    try:
        np.savez_compressed(out / "functions.npz", **functions())
    except Exception:  # noqa: BLE001 - the products are what this call is for
        print(traceback.format_exc()[-1500:], flush=True)
    print("cases ok:", sum(v == "ok" for v in facts["cases"].values()), "of", len(facts["cases"]))


if __name__ == "__main__":
    main()
