"""Two outputs of one call compared element-wise, as `pallas-check diff` does (commands/diff.py):
per-dtype tolerances, NaN equal to NaN, the first mismatches kept as JSON-friendly scalars.
"""

from __future__ import annotations

import dataclasses
from typing import TypedDict, Union

import numpy as np


FIRST_MISMATCHES = 5

# One element of an output as the report writes it (`_scalar`): JSON-friendly.
Scalar = Union[bool, int, float, str]


# Default tolerances per float dtype (itemsize; bfloat16 is told apart by name).
_TOLERANCES = {"bfloat16": (1.6e-2, 1e-3), 2: (1e-3, 1e-5), 4: (1e-5, 1e-6),
               8: (1e-7, 1e-9)}


@dataclasses.dataclass
class Mismatch:
    index: tuple[int, ...]
    ours: Scalar
    theirs: Scalar


@dataclasses.dataclass
class OutputDiff:
    output: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    size: int
    mismatches: int
    max_abs: float
    max_rel: float
    first: list[Mismatch]
    rtol: float | None = None
    atol: float | None = None
    note: str | None = None  # e.g. the other side's shape or dtype, when it differs
    # Elements ours never wrote (the fill, against whatever the other side left there):
    # counted here, never as mismatches (see `compare`).
    never_written: int = 0
    # The call drew from a core's hardware PRNG: ours are our generator's bits, the other
    # side's its own; the values are not compared (only the shape and dtype).
    drawn: bool = False
    # `replay --expect-findings`: mismatching elements a finding of ours on the call
    # explains (the defect's values), moved here from `mismatches`.
    explained: int = 0


class _Named(TypedDict):
    """The fields of an `OutputDiff` that name the output, whatever the comparison found."""

    output: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    size: int


# Against a chip (`diff` against native, `replay`): its own noise, measured on a TPU v5e
# (hardware/README.md): float32 transcendentals up to 6.6e-6 relative (exp) and 4.3e-5 of
# their output's largest magnitude (log1p, tanh), an approximate reciprocal 1.6e-5, matrix
# products' accumulation order about 3e-7 of the largest output. Per float kind: rtol and
# atol as a fraction of the chip output's largest finite magnitude.
_CHIP_TOLERANCES = {"bfloat16": (1.6e-2, 4e-3), 2: (1e-3, 1e-3), 4: (3e-5, 1e-4),
                    8: (3e-5, 1e-4)}


def chip_tolerances(dtype: np.dtype, theirs: np.ndarray, rtol: float | None,
                    atol: float | None) -> tuple[float, float]:
    """(rtol, atol) against a chip's output `theirs`: the user's where given, else the
    dtype's defaults widened to the chip's measured noise (`_CHIP_TOLERANCES`)."""
    r, a = tolerances(dtype, rtol, atol)
    if not _is_float(dtype):
        return r, a
    key: str | int = "bfloat16" if dtype.name == "bfloat16" else min(dtype.itemsize, 8)
    chip_r, chip_a = _CHIP_TOLERANCES.get(key, _CHIP_TOLERANCES[4])
    with np.errstate(invalid="ignore"):
        y = np.abs(np.asarray(theirs).astype(np.float64, copy=False))
    finite = y[np.isfinite(y)]
    scale = float(finite.max()) if finite.size else 0.0
    return (max(r, chip_r) if rtol is None else r), (max(a, chip_a * scale) if atol is None
                                                     else a)


def tolerances(dtype: np.dtype, rtol: float | None, atol: float | None
               ) -> tuple[float, float]:
    """(rtol, atol) for a dtype: the user's where given, else the dtype's defaults."""
    if not _is_float(dtype):
        return 0.0, 0.0
    key: str | int = "bfloat16" if dtype.name == "bfloat16" else min(dtype.itemsize, 8)
    if np.issubdtype(dtype, np.complexfloating):
        key = dtype.itemsize // 2
    default_rtol, default_atol = _TOLERANCES.get(key, _TOLERANCES[4])
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name in ("bfloat16",) or "float8" in dtype.name


def _scalar(x: np.generic | complex) -> Scalar:
    """A JSON-friendly scalar: ints and bools as such, non-finite floats as strings."""
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer, int)):
        return int(x)
    if isinstance(x, (np.complexfloating, complex)):
        return str(complex(x))
    value = float(x)
    return value if np.isfinite(value) else str(value)


def compare_drawn(ours: np.ndarray, theirs: np.ndarray, output: tuple[int, str] = (0, "")
                  ) -> OutputDiff:
    """An output of a call in which a core drew from its hardware PRNG, whose bits no
    simulation reproduces: only its shape and dtype are compared (each element a mismatch
    when they differ)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    differs = ours.shape != theirs.shape or ours.dtype != theirs.dtype
    note = (f"the other side's shape and dtype are {tuple(theirs.shape)} {theirs.dtype}"
            if differs else None)
    return OutputDiff(output=output[0], name=output[1], shape=tuple(ours.shape),
                      dtype=str(ours.dtype), size=int(ours.size),
                      mismatches=int(ours.size) if differs else 0, max_abs=0.0, max_rel=0.0,
                      first=[], note=note, drawn=True)


def compare(ours: np.ndarray, theirs: np.ndarray, rtol: float | None = None,
            atol: float | None = None, output: tuple[int, str] = (0, ""),
            never: np.ndarray | None = None, chip: bool = False) -> OutputDiff:
    """Element-wise comparison; NaN equals NaN, infinities equal themselves. `never`: the
    elements ours never wrote (the engine's written-shadow): what a kernel leaves unwritten
    holds our fill on our side and whatever memory held on a chip, so they are counted
    apart (`never_written`) and take no part in the mismatches or the errors. `output`:
    its position and name among the call's outputs. `chip`:
    `theirs` is a chip's output, compared within the chip's own noise (`chip_tolerances`).
    (An output a core's hardware PRNG drew: `compare_drawn`.)"""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if chip and ours.shape == theirs.shape:
        written = theirs if never is None or never.shape != theirs.shape else np.where(
            never, 0, theirs)
        r, a = chip_tolerances(ours.dtype, written, rtol, atol)
    else:
        r, a = tolerances(ours.dtype, rtol, atol)
    base: _Named = {"output": output[0], "name": output[1], "shape": tuple(ours.shape),
                    "dtype": str(ours.dtype), "size": int(ours.size)}
    if ours.shape != theirs.shape:
        return OutputDiff(**base, mismatches=int(ours.size), max_abs=float("inf"),
                          max_rel=float("inf"), first=[],
                          note=f"the other side's shape is {tuple(theirs.shape)}")
    note = (None if ours.dtype == theirs.dtype
            else f"the other side's dtype is {theirs.dtype}")
    if _is_float(ours.dtype) or _is_float(theirs.dtype):
        wide = np.complex128 if (ours.dtype.kind == "c" or theirs.dtype.kind == "c") \
            else np.float64
        x, y = ours.astype(wide), theirs.astype(wide)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            err = np.where(same, 0.0, np.abs(x - y))
            err = np.where(np.isnan(err), np.inf, err)  # NaN against a number, inf - inf
            close = same | (err <= a + r * np.abs(y))
            rel = np.where(err == 0, 0.0, err / np.abs(y))
            rel = np.where(np.isnan(rel), np.inf, rel)  # an infinite error against inf
    else:
        x, y = ours, theirs
        close = x == y
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            err = np.abs(x.astype(np.float64) - y.astype(np.float64))
            rel = np.where(err == 0, 0.0, err / np.abs(y.astype(np.float64)))
    unwritten = 0
    if never is not None and never.shape == ours.shape:
        unwritten = int(np.count_nonzero(never))
        close = np.asarray(close) | never
        err = np.where(never, 0.0, err)
        rel = np.where(never, 0.0, rel)
    bad = np.flatnonzero(~np.asarray(close).ravel())
    first = [Mismatch(tuple(int(i) for i in np.unravel_index(k, ours.shape)),
                      _scalar(ours.ravel()[k]), _scalar(theirs.ravel()[k]))
             for k in bad[:FIRST_MISMATCHES]]
    max_abs = float(np.max(err)) if err.size else 0.0
    max_rel = float(np.max(rel)) if rel.size else 0.0
    return OutputDiff(**base, mismatches=int(bad.size), max_abs=max_abs, max_rel=max_rel,
                      first=first, rtol=r, atol=a, note=note, never_written=unwritten)
