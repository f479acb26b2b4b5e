"""Keep what the chip did, small: from a device run's probe results (`$OUT/r` of
hardware/device_call*.sh, unpacked) to the files committed under hardware/chip/v5e/.

- numerics.json: per case, whether the chip took it (or its error) and, for products,
  the largest difference from each rounding model; transcendentals' and reductions'
  errors against float64 (what hardware/README.md's tables show);
- matmul.npz: the operands of the f32 products (x's first 16 rows, y) and the chip's
  results of those rows, kernel and XLA, per precision (tests/jaxbridge/test_matmul.py);
- semaphores.json: each DMA case's readings (reads until non-zero, first non-zero reading,
  reading once landed, reading after the kernel took the count off);
- bounded.json: per BoundedSlice kernel, the largest error of each block of rows.

Usage: python hardware/extract.py RESULTS_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import scipy.special as sps

BF16 = ml_dtypes.bfloat16
ROWS = 16


def f64(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:  # bfloat16 saved as raw bytes
        a = a.view(BF16)
    return a.astype(np.float64)


def split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = a.astype(np.float32)
    hi = a.astype(BF16).astype(np.float32)
    mid = (a - hi).astype(BF16).astype(np.float32)
    lo = (a - hi - mid).astype(BF16).astype(np.float32)
    return hi.astype(np.float64), mid.astype(np.float64), lo.astype(np.float64)


def product_models(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    (xh, xm, xl), (yh, ym, yl) = split(x), split(y)
    return {"exact": f64(x) @ f64(y), "bf16x1": xh @ yh,
            "bf16x3": xh @ yh + xh @ ym + xm @ yh,
            "bf16x6": xh @ yh + xh @ ym + xm @ yh + xm @ ym + xh @ yl + xl @ yh}


UNARY = {"exp": np.exp, "log": np.log, "tanh": np.tanh,
         "logistic": lambda v: 1 / (1 + np.exp(-v)), "sin": np.sin, "cos": np.cos,
         "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v), "recip": lambda v: 1 / v,
         "recip_approx": lambda v: 1 / v, "erf": sps.erf, "log1p": np.log1p,
         "expm1": np.expm1, "exp2": np.exp2, "pow2_5": lambda v: v ** 2.5,
         "atan": np.arctan, "erf_inv": sps.erfinv}


def numerics(r: Path, out: Path) -> None:
    d = np.load(r / "numerics.npz")
    facts = json.loads((r / "numerics.json").read_text())
    summary: dict = {"device_kind": facts["device_kind"], "jax": facts["jax"],
                     "libtpu": facts["libtpu"], "cases": {}}
    for key, case in facts["cases"].items():
        summary["cases"][key] = ({"ok": True} if case.get("ok") else
                                 {"ok": False, "error_type": case["error_type"],
                                  "error": case["error"].splitlines()[0][:300]})
    x, y = d["x32"], d["y32"]
    models = product_models(x, y)
    for key in d.files:
        if key.startswith(("kernel.f32.", "xla.f32.", "kernel.mixed", "xla.mixed",
                           "kernel.bf16_f32out", "xla.bf16_f32out")):
            if "mixed" in key:
                m = {"x_rounded": models["bf16x1"], "exact": f64(x) @ f64(y.astype(BF16))}
            elif "bf16" in key:
                m = {"exact": models["bf16x1"]}
            else:
                m = models
            summary["cases"][key]["max_abs_diff"] = {
                name: float(np.abs(f64(d[key]) - v).max()) for name, v in m.items()}
    for name, fn in UNARY.items():
        inp = d[f"in.{name}"].astype(np.float64)
        with np.errstate(all="ignore"):
            ref = fn(inp)
        for side in ("kernel", "xla"):
            key = f"{side}.unary.{name}"
            if key not in d.files:
                continue
            v = d[key].astype(np.float64)
            fin = np.isfinite(ref) & (np.abs(ref) > 1e-30) & (np.abs(ref) < 3e38)
            err = np.abs(v[fin] - ref[fin])
            summary["cases"][key].update(
                max_rel=float((err / np.abs(ref[fin])).max()),
                max_abs_of_scale=float(err.max() / np.abs(ref[fin]).max()),
                max_ulp=float((err / np.spacing(np.abs(ref[fin]).astype(np.float32))).max()),
                same_as_float32_rounding=float(np.mean(v[fin] == ref[fin].astype(np.float32))))
    np.savez_compressed(out / "unary.npz", **{
        k: np.asarray(d[k]).reshape(-1)[::8] for k in d.files
        if k.startswith("in.") and not k.endswith("bf16") or k.startswith("kernel.unary.")
        and not k.endswith("bf16")})
    np.savez_compressed(out / "matmul.npz", x=x[:ROWS], y=y, **{
        key: np.asarray(d[key])[:ROWS] for key in d.files
        if key.startswith(("kernel.f32.", "xla.f32."))})
    (out / "numerics.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


def semaphores(r: Path, out: Path) -> None:
    found: dict = {}
    for path in sorted(r.glob("semaphores_*.npz")):
        d = np.load(path)
        facts = json.loads(path.with_suffix(".json").read_text())
        for key in d.files:
            spins, first, landed, after = (int(v) for v in d[key])
            found[key] = {"reads_until_nonzero": spins, "first_nonzero": first,
                          "landed": landed, "after_taken_off": after}
        for key, case in facts["cases"].items():
            if not case.get("ok"):
                found[key] = {"error": case["error"].splitlines()[0][:300]}
    (out / "semaphores.json").write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


def bounded(r: Path, out: Path) -> None:
    d = np.load(r / "bounded.npz")
    x = d["copy.x"].astype(np.float64)
    found: dict = {}
    for tag in ("exact", "full"):
        o = d[f"copy.{tag}"].astype(np.float64)
        found[f"copy.{tag}"] = _blocks(o, x + 1)
        xa = d["acc.x"].astype(np.float64)
        found[f"acc.{tag}"] = _blocks(d[f"acc.{tag}"].astype(np.float64),
                                      xa.reshape(200, 3, 128).sum(1))
    xl, wl = d["lse.x"].astype(np.float64), d["lse.w"].astype(np.float64)
    for key in d.files:
        if key.startswith("lse.") and key not in ("lse.x", "lse.w"):
            if key.endswith("default"):
                logits = product_models(d["lse.x"], d["lse.w"])["bf16x1"]
            else:
                logits = xl @ wl
            m = logits.max(1, keepdims=True)
            ref = m + np.log(np.exp(logits - m).sum(1, keepdims=True))
            found[key] = _blocks(d[key].astype(np.float64), np.broadcast_to(ref, (200, 128)))
    (out / "bounded.json").write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


def _blocks(got: np.ndarray, want: np.ndarray) -> dict:
    err = np.abs(got - want).max(axis=1)
    return {"rows 0-127 max error": float(err[:128].max()),
            "rows 128-199 (the ragged block) max error": float(err[128:].max())}


def main() -> None:
    r = Path(sys.argv[1])
    out = Path(__file__).resolve().parent / "chip" / "v5e"
    out.mkdir(parents=True, exist_ok=True)
    numerics(r, out)
    semaphores(r, out)
    bounded(r, out)


if __name__ == "__main__":
    main()
