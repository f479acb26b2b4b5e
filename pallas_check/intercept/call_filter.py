"""Which calls of a run are checked: `--kernel GLOB` and `--calls N` (issue 29).

A training or decode loop calls the same kernels thousands of times; checking each call in
full makes a run of seconds one of hours. Like compute-sanitizer's `--kernel-name` and
`--launch-count`, a run may check only the kernels whose name matches a glob, and only the
first N calls of each *call structure* -- the kernel (its name and where it is defined), the
operands' shapes and dtypes, and its static parameters (the kernel's jaxpr, its grid and
BlockSpecs, its compiler parameters) -- since a later call of the same structure runs the
same code on other values. The other calls are passed through: they still run (the script
needs their outputs) but no finding of theirs is made (intercept/session.py).

Nothing here imports JAX; the session asks `checks(...)` once per call.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import threading
from typing import Hashable, Mapping, Protocol, Sequence

from pallas_check.jaxbridge.params import static_text


class Kernel(Hashable, Protocol):
    """A call's kernel as the session describes it: its name (and, hashed, where it is
    defined: one structure per kernel)."""

    @property
    def name(self) -> str: ...


class Operand(Protocol):
    """An operand of a call: what its structure reads of it."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> object: ...


@dataclasses.dataclass
class KernelCounts:
    """Per kernel name: how many calls were checked and how many passed through."""

    checked: int = 0
    passed_through: int = 0


class CallFilter:
    """The run's filters, and what they decided so far (safe across callback threads)."""

    def __init__(self, kernels: Sequence[str] | None, calls: int) -> None:
        self.kernels = tuple(kernels or ())
        self.calls = int(calls or 0)
        self._lock = threading.Lock()
        # structure -> calls
        self._seen: collections.Counter[tuple[object, ...]] = collections.Counter()
        self.counts: dict[str, KernelCounts] = {}
        self._structures = StructureKeys()

    @property
    def active(self) -> bool:
        return bool(self.kernels) or self.calls > 0

    def selects(self, name: str) -> bool:
        """Whether `--kernel` selects the kernel named `name` (no --kernel: every kernel)."""
        return not self.kernels or any(fnmatch.fnmatchcase(name, glob)
                                       for glob in self.kernels)

    def checks(self, kernel: Kernel, params: Mapping[str, object],
               operands: Sequence[Operand]) -> bool:
        """Whether this call is checked (counted either way, under its kernel's name)."""
        checked = self.selects(kernel.name)
        if checked and self.calls > 0:
            key = (kernel, self.structure(params),
                   tuple((o.shape, o.dtype) for o in operands))
            with self._lock:
                self._seen[key] += 1
                checked = self._seen[key] <= self.calls
        with self._lock:
            counts = self.counts.setdefault(kernel.name, KernelCounts())
            if checked:
                counts.checked += 1
            else:
                counts.passed_through += 1
        return checked

    def passed_through(self) -> dict[str, int]:
        """Calls passed through, per kernel name (only kernels that had any)."""
        with self._lock:
            return {name: c.passed_through for name, c in sorted(self.counts.items())
                    if c.passed_through}

    def structure(self, params: Mapping[str, object]) -> str:
        """The call's static parameters as text (`static_text`), remembered per params."""
        return self._structures.of(params)


class StructureKeys:
    """The structure text of a call's params, remembered by the params dict's identity
    (a jitted call's lowering hands the same dict to every one of its calls): printing a
    jaxpr costs about as much as a small call's pass-through."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._static: dict[int, tuple[Mapping[str, object], str]] = {}

    def of(self, params: Mapping[str, object]) -> str:
        entry = self._static.get(id(params))
        if entry is not None and entry[0] is params:
            return entry[1]
        text = static_text(params)
        with self._lock:
            if len(self._static) >= 1024:  # eager calls: a new dict each time
                self._static.clear()
            self._static[id(params)] = (params, text)
        return text


