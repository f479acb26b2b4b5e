"""Output elements whose values the kernel did not decide: never written by it, or
depending on memory that was never written. Each is an `Exposure`: which output elements
(a mask) and the values they take when never-written memory holds the other fill.

A call's `unwritten-output` and `uninitialized` findings are about these elements; whether
they matter is decided one level up, by what the program keeps of them (the session
re-runs the jitted call around the kernel with these elements changed: pallas_check/
intercept/judge.py). The engine only says which elements and what the other fill makes of them.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from pallas_check.engine.memory.buffer import fill_value
from pallas_check.findings.kinds import FindingKind


class Exposure(NamedTuple):
    """Elements `mask` of output `output` (its kernel name `name`) on device `device` hold
    `values` when never-written memory holds the other fill (a scalar for never-written
    output elements, else one value per masked element, in C order). `kind`: the finding
    kind these elements are reported under."""

    kind: FindingKind
    name: str
    device: int
    output: int
    mask: np.ndarray
    values: np.ndarray

    def apply(self, outputs: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """`outputs` (per device, per output) with these elements set to their other
        values (the array changed is copied first when it is read-only)."""
        changed = [list(device) for device in outputs]
        target = changed[self.device][self.output]
        if not target.flags.writeable:
            target = np.array(target)
            changed[self.device][self.output] = target
        target[self.mask] = self.values
        return changed


def differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise: whether `a` and `b` differ (a NaN equals a NaN)."""
    if a.dtype.kind in "fc" or "float" in a.dtype.name:
        # A signalling NaN (bits a kernel moved, e.g. through a bitcast) raises the FPU's
        # invalid flag when widened: numpy would warn on the user's stderr.
        with np.errstate(invalid="ignore"):
            af, bf = a.astype(np.float64), b.astype(np.float64)
        both_nan = np.isnan(af) & np.isnan(bf)
        differ: np.ndarray = ~((af == bf) | both_nan)
        return differ
    unequal: np.ndarray = a != b
    return unequal


def unwritten(names: Sequence[str], outputs: Sequence[Sequence[np.ndarray]],
              written: Sequence[Sequence[np.ndarray | None]],
              other_fill: str) -> list[Exposure]:
    """Output elements the kernel never wrote (`written`: each output's written-shadow,
    None for an output aliased to an input, whose unwritten elements keep the input's
    values, or for a semaphore), with the other fill as their other value."""
    found = []
    for device, (device_outputs, device_written) in enumerate(zip(outputs, written)):
        for j, (out, shadow) in enumerate(zip(device_outputs, device_written)):
            if shadow is None or bool(shadow.all()):
                continue
            found.append(Exposure(FindingKind.UNWRITTEN_OUTPUT, names[j], device, j,
                                  ~shadow, fill_value(out.dtype, other_fill)))
    return found


def dependent(names: Sequence[str], outputs: Sequence[Sequence[np.ndarray]],
              other: Sequence[Sequence[np.ndarray]],
              written: Sequence[Sequence[np.ndarray | None]]) -> list[Exposure]:
    """Written output elements whose values change with the fill of never-written memory
    (`other`: the outputs of the run with the other fill), with their values there."""
    found = []
    for device, device_outputs in enumerate(outputs):
        for j, out in enumerate(device_outputs):
            changed = differs(np.asarray(out), np.asarray(other[device][j]))
            shadow = written[device][j]
            if shadow is not None:
                changed &= shadow
            if changed.any():
                found.append(Exposure(FindingKind.UNINITIALIZED, names[j], device, j,
                                      changed, np.asarray(other[device][j])[changed]))
    return found


# Per (device, output): the elements a call never wrote (commands/diff.py compares them
# apart: a chip leaves whatever was there, ours the fill).
NeverWritten = dict[tuple[int, int], np.ndarray]


def never_written(found: Sequence[Exposure]) -> NeverWritten:
    """The never-written output elements among a call's exposures, by (device, output):
    the engine's written-shadow of each output, exact and already computed."""
    masks: NeverWritten = {}
    for exposure in found:
        if exposure.kind is FindingKind.UNWRITTEN_OUTPUT:
            masks[(exposure.device, exposure.output)] = np.asarray(exposure.mask, bool)
    return masks
