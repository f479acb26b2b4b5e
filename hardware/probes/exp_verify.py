"""Every float32 through the chip's exp2 and exp, against pallas-check's model of them; and
the chip's reciprocal, densely, with candidate algorithms computed on the chip itself.

Why: `pallas_check/jaxbridge/chip_exp.py` models a v5e's exp2/exp from 7.7 million values
(hardware/probes/exp_bits.py). Here the chip checks the model on all 2**32 bit patterns:
its own `exp2`/`exp` in a Pallas kernel (and `exp` as a plain XLA:TPU program) against the
model evaluated on the chip in 32-bit integer operations (exact there as anywhere), and
reports how many differ, with the first differing inputs.

Division on the chip is `a * (1 / b)` bit for bit (exp_bits.py); its reciprocal is within
one ulp of the correctly rounded one. To model it: the approximate reciprocal
(`pl.reciprocal(approx=True)`, the hardware's seed) and the full one for every mantissa on
a 2**-21 grid of [1, 2), and how often candidate refinements of the seed, computed by the
chip in float32, equal the chip's own `1 / b`.

Results: `$OUT/exp_verify.json` (counts, first mismatches), `$OUT/recip_seed.npz`, `$OUT/recip_full.npz`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call  # noqa: E402
from pallas_check.jaxbridge import chip_exp  # noqa: E402

ROWS, BLOCK = 1024, 512
CHUNK_ROWS = int(os.environ.get("CHUNK_ROWS", 1 << 14))


def kernel_map(fn: Callable[..., Any], *xs: Any) -> Any:
    """fn elementwise over (CHUNK_ROWS, ROWS) float32 arrays in a Pallas kernel."""
    spec = pl.BlockSpec((BLOCK, ROWS), lambda i: (i, 0))

    def kernel(*refs: Any) -> None:
        *ins, out = refs
        out[...] = fn(*(r[...] for r in ins))

    rows = xs[0].shape[0]
    return call(kernel, out_shape=jax.ShapeDtypeStruct(xs[0].shape, jnp.float32),
                grid=(rows // BLOCK,), in_specs=[spec] * len(xs), out_specs=spec)(*xs)


def _patterns(base: Any) -> Any:
    bits = (jax.lax.broadcasted_iota(jnp.uint32, (CHUNK_ROWS, ROWS), 0) * np.uint32(ROWS)
            + jax.lax.broadcasted_iota(jnp.uint32, (CHUNK_ROWS, ROWS), 1) + base)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _differ(a: Any, b: Any) -> Any:
    ab = jax.lax.bitcast_convert_type(a, jnp.uint32)
    bb = jax.lax.bitcast_convert_type(b, jnp.uint32)
    return (ab != bb) & ~(jnp.isnan(a) & jnp.isnan(b))


def make_check(name: str) -> Callable[[Any], Any]:
    model = {"exp2": chip_exp._exp2_jnp, "exp": chip_exp.exp_jnp,
             "xla_exp": chip_exp.exp_jnp}[name]

    @jax.jit
    def check(base: Any) -> Any:
        x = _patterns(base)
        if name == "xla_exp":
            chip = jnp.exp(x)
        else:
            chip = kernel_map(jnp.exp2 if name == "exp2" else jnp.exp, x)
        bad = _differ(chip, model(x))
        where = jnp.nonzero(bad.reshape(-1), size=8, fill_value=-1)[0]
        return bad.sum(), where, chip.reshape(-1)[jnp.maximum(where, 0)]
    return check


def exhaustive(facts: dict[str, Any], name: str, deadline: float) -> None:
    check = make_check(name)
    total, chunks, examples = 0, 0, []
    step = CHUNK_ROWS * ROWS
    count_chunks = (1 << 32) // step
    width = count_chunks.bit_length() - 1
    order = [int(format(i, f"0{width}b")[::-1], 2) for i in range(count_chunks)]
    for base in (i * step for i in order):  # spread over the range if time runs out
        if time.time() > deadline:
            break
        count, where, chip = jax.device_get(check(np.uint32(base)))
        total += int(count)
        chunks += 1
        for w, c in zip(where, chip):
            if w >= 0 and len(examples) < 64:
                bits = np.uint32(base + int(w))
                examples.append({"bits": hex(int(bits)), "x": float(bits.view(np.float32)),
                                 "chip": float(c),
                                 "model": float(chip_exp.exp2_bits(bits.view(np.float32))
                                                if name == "exp2" else
                                                chip_exp.exp_bits(bits.view(np.float32)))})
    facts[name] = {"patterns_checked": chunks * step, "differ": total, "examples": examples}
    print(name, facts[name]["patterns_checked"], "checked,", total, "differ", flush=True)


CANDIDATES = ("r0*(2-b*r0)", "r0+r0*(1-b*r0)", "r0+e*r0", "two_steps", "r0*(1+e)",
              "(r0+r0)-b*r0*r0")


def reciprocal(facts: dict[str, Any], out: Path) -> None:
    k = np.arange(1 << 21, dtype=np.float64)
    b = (1.0 + k / (1 << 21)).astype(np.float32).reshape(-1, ROWS)
    seed = np.asarray(jax.jit(lambda v: kernel_map(lambda q: pl.reciprocal(q, approx=True),
                                                   v))(b))
    full = np.asarray(jax.jit(lambda v: kernel_map(lambda q: 1 / q, v))(b))
    np.savez_compressed(out / "recip_seed.npz", seed=seed.reshape(-1))
    np.savez_compressed(out / "recip_full.npz", full=full.reshape(-1))

    def candidates(q: Any) -> Any:
        r0 = pl.reciprocal(q, approx=True)
        e = 1 - q * r0
        return {"r0*(2-b*r0)": r0 * (2 - q * r0), "r0+r0*(1-b*r0)": r0 + r0 * e,
                "r0+e*r0": r0 + e * r0, "two_steps": (lambda r1: r1 * (2 - q * r1))(
                    r0 * (2 - q * r0)),
                "r0*(1+e)": r0 * (1 + e), "(r0+r0)-b*r0*r0": (r0 + r0) - q * r0 * r0}
    facts["recip"] = {}
    for key in CANDIDATES:
        fn = jax.jit(lambda v, key=key: kernel_map(lambda q: candidates(q)[key], v))
        got = np.asarray(fn(b))
        same = (got.view(np.uint32) == full.view(np.uint32))
        facts["recip"][key] = {"equal_to_chip_1_over_b": int(same.sum()), "of": int(same.size)}
        print("recip", key, int(same.sum()), "of", same.size, flush=True)
    xla = np.asarray(jax.jit(lambda v: 1 / v)(b))
    facts["recip"]["xla_tpu_equals_kernel"] = int((xla.view(np.uint32)
                                                   == full.view(np.uint32)).sum())


def main() -> None:
    out = Path(os.environ.get("OUT", "hwout"))
    out.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {"device_kind": jax.devices()[0].device_kind,
                             "jax": jax.__version__}
    budget = float(os.environ.get("EXHAUSTIVE_SECONDS", "100"))
    try:
        reciprocal(facts, out)
    except Exception as exc:  # noqa: BLE001 - recorded, the rest still runs
        facts["recip_error"] = f"{type(exc).__name__}: {exc}"[:3000]
        print(facts["recip_error"], flush=True)
    (out / "exp_verify.json").write_text(json.dumps(facts, indent=1))
    for name in ("exp2", "exp", "xla_exp"):
        exhaustive(facts, name, time.time() + budget)
        (out / "exp_verify.json").write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main()
