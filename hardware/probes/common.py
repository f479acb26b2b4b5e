"""What every probe shares: where results go, how a case is run and kept.

A probe runs its cases one by one; each case is a small kernel whose outputs (or the
error the chip raised) are kept under a name. Results go to `$OUT/<probe>.npz` (arrays)
and `$OUT/<probe>.json` (per case: ok or the error, and any scalars), so the analysis
(`hardware/analyze.py`) runs later on any CPU from the committed files.

`PROBE_INTERPRET=1` runs the kernels in JAX's TPU interpreter: a smoke test of the probe
on a CPU, never evidence.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

INTERPRET = os.environ.get("PROBE_INTERPRET") == "1"


def call(kernel: Callable[..., None], **kw: Any) -> Any:
    """pl.pallas_call, in JAX's TPU interpreter under PROBE_INTERPRET=1."""
    if INTERPRET:
        kw["interpret"] = pltpu.InterpretParams()
    return pl.pallas_call(kernel, **kw)


class Results:
    """Arrays and per-case facts of one probe, written at every case (a halt keeps what
    the earlier cases found)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.out = Path(os.environ.get("OUT", "hwout"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.arrays: dict[str, np.ndarray] = {}
        self.facts: dict[str, Any] = {
            "probe": name, "interpret": INTERPRET,
            "device_kind": jax.devices()[0].device_kind,
            "platform": jax.devices()[0].platform, "jax": jax.__version__,
            "cases": {}}
        try:
            import libtpu  # noqa: F401
            from importlib.metadata import version
            self.facts["libtpu"] = version("libtpu")
        except Exception:  # noqa: BLE001 - a fact, absent where libtpu is
            self.facts["libtpu"] = None

    def array(self, key: str, value: Any) -> None:
        self.arrays[key] = np.asarray(value)

    def case(self, key: str, fn: Callable[[], Any]) -> Any:
        """Run one case; keep its outputs or its error, never stop the probe."""
        started = time.perf_counter()
        try:
            value = fn()
            value = jax.block_until_ready(value)
        except Exception as exc:  # noqa: BLE001 - what the chip said is the finding
            self.facts["cases"][key] = {
                "ok": False, "error_type": f"{type(exc).__module__}.{type(exc).__name__}",
                "error": str(exc)[:3000], "traceback": traceback.format_exc()[-3000:]}
            print(f"[{self.name}] {key}: {type(exc).__name__}: {str(exc)[:300]}",
                  flush=True)
            self.flush()
            return None
        entry: dict[str, Any] = {"ok": True, "seconds": round(time.perf_counter() - started, 3)}
        if isinstance(value, dict):
            for k, v in value.items():
                self.arrays[f"{key}.{k}"] = np.asarray(v)
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                self.arrays[f"{key}.{i}"] = np.asarray(v)
        elif value is not None:
            self.arrays[key] = np.asarray(value)
        self.facts["cases"][key] = entry
        print(f"[{self.name}] {key}: ok", flush=True)
        self.flush()
        return value

    def fact(self, key: str, **facts: Any) -> None:
        self.facts["cases"].setdefault(key, {}).update(facts)
        self.flush()

    def flush(self) -> None:
        np.savez_compressed(self.out / f"{self.name}.npz", **self.arrays)
        (self.out / f"{self.name}.json").write_text(json.dumps(self.facts, indent=1,
                                                               default=str))


def main_guard(run: Callable[[Results], None], name: str) -> None:
    results = Results(name)
    try:
        run(results)
    finally:
        results.flush()
        print(f"[{name}] done: {sum(1 for c in results.facts['cases'].values() if c.get('ok'))}"
              f" of {len(results.facts['cases'])} cases ok", file=sys.stderr, flush=True)
