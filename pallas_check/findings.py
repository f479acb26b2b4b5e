"""Findings are plain data: the engine and checkers create them, reporters render them.

Nothing here prints. A Finding carries everything a reporter needs (kind, buffer, range,
the user's source frames) so that table, JSON and SARIF output are pure functions of it.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable


class FindingKind(str, enum.Enum):
    """Kinds of defect pallas-check reports; the value is the stable JSON name."""

    OUT_OF_BOUNDS = "out-of-bounds"
    UNINITIALIZED = "uninitialized"
    UNWRITTEN_OUTPUT = "unwritten-output"
    OUTPUT_REVISITED = "output-revisited"
    SEMAPHORE_LEAK = "semaphore-leak"
    DMA_NOT_WAITED = "dma-not-waited"
    RACE = "race"
    DEADLOCK = "deadlock"
    UNUSED_SUPPRESSION = "unused-suppression"  # a `# pallas-check: ignore` that matched nothing
    COMPILE_ERROR = "compile-error"  # --compile: the TPU toolchain rejects the kernel
    VMEM_EXCEEDED = "vmem-exceeded"  # the kernel does not fit the chip's VMEM or SMEM
    CHECK_FAILED = "check-failed"  # the kernel's own `pl.debug_check` failed


@dataclass(frozen=True, order=True)
class SourceFrame:
    """One frame of the user's code (JAX's and pallas-check's own frames are trimmed)."""

    file: str
    line: int
    function: str
    code: str = ""
    # 1-based column of the expression (Python's code positions), 0 when unknown; not part
    # of a frame's identity, so findings on one line still merge as before.
    column: int = field(default=0, compare=False)

    def short(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class KernelInfo:
    """Which kernel a finding belongs to: its name and where it is defined."""

    name: str
    file: str = ""
    line: int = 0


IndexRange = tuple[tuple[int, int], ...]  # per dimension [start, stop)


def format_range(index_range: IndexRange | None) -> str:
    """`[0:8, 120:136]` style text for an index range (a single index prints bare)."""
    if index_range is None:
        return ""
    parts = []
    for start, stop in index_range:
        parts.append(str(start) if stop == start + 1 else f"{start}:{stop}")
    return "[" + ", ".join(parts) + "]"


@dataclass(frozen=True)
class Access:
    """One memory access or operation involved in a finding (races name two)."""

    operation: str  # "read", "write", "dma-read", "dma-write", "signal", "wait", ...
    actor: str
    buffer: str = ""
    memory_space: str = ""
    index_range: IndexRange | None = None
    frames: tuple[SourceFrame, ...] = ()
    grid_point: tuple[int, ...] | None = None


@dataclass
class Finding:
    """A defect found in one pallas_call. Equal findings are merged and counted."""

    kind: FindingKind
    message: str
    kernel: KernelInfo
    call_index: int
    grid_point: tuple[int, ...] | None = None
    actor: str = ""
    buffer: str = ""
    memory_space: str = ""
    index_range: IndexRange | None = None
    frames: tuple[SourceFrame, ...] = ()
    accesses: tuple[Access, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    count: int = 1

    def merge_key(self) -> tuple:
        """Findings with this key equal are the same defect seen again (e.g. each grid step)."""
        if self.kind == FindingKind.RACE:
            # A race is one pair of accesses, whichever of the two was seen second.
            return (self.kind, self.kernel.name, self.kernel.file, self.buffer,
                    tuple(sorted((a.operation.removeprefix("DMA "), a.frames[:1])
                                 for a in self.accesses)))
        return (
            self.kind,
            self.kernel.name,
            self.kernel.file,
            self.kernel.line,
            self.buffer,
            self.frames[:1],
            tuple((a.operation, a.buffer, a.frames[:1]) for a in self.accesses),
            self.details.get("merge", ""),
        )

    @property
    def location(self) -> SourceFrame | None:
        """The user's source line the finding points at (innermost user frame)."""
        if self.frames:
            return self.frames[0]
        for access in self.accesses:
            if access.frames:
                return access.frames[0]
        return None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["kind"] = self.kind.value
        data["index_range"] = _range_list(self.index_range)
        data["grid_point"] = list(self.grid_point) if self.grid_point is not None else None
        for access in data["accesses"]:
            access["index_range"] = _range_list(access["index_range"])
            if access["grid_point"] is not None:
                access["grid_point"] = list(access["grid_point"])
        return data


def _range_list(index_range: Any) -> list[list[int]] | None:
    if index_range is None:
        return None
    return [[int(a), int(b)] for a, b in index_range]


class FindingStore:
    """Collects findings of a whole run, merging duplicates; safe across callback threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple, Finding] = {}

    def add(self, finding: Finding) -> None:
        key = finding.merge_key()
        with self._lock:
            existing = self._by_key.get(key)
            if existing is None:
                self._by_key[key] = finding
            else:
                existing.count += finding.count

    def extend(self, findings: Iterable[Finding]) -> None:
        for finding in findings:
            self.add(finding)

    def discard(self, drop: Any) -> int:
        """Remove the findings `drop(finding)` is true of; how many were removed."""
        with self._lock:
            keys = [key for key, finding in self._by_key.items() if drop(finding)]
            for key in keys:
                del self._by_key[key]
        return len(keys)

    def all(self) -> list[Finding]:
        """Findings in a stable order: by call, then kind, then source location."""
        with self._lock:
            items = list(self._by_key.values())
        return sorted(items, key=_sort_key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)


def _sort_key(f: Finding) -> tuple:
    loc = f.location
    return (
        f.call_index,
        f.kind.value,
        f.buffer,
        loc.file if loc else "",
        loc.line if loc else 0,
        f.grid_point or (),
    )


@dataclasses.dataclass
class CallSummary:
    """What the report says about one pallas_call: which kernel, its grid, its cost."""

    index: int
    kernel: str
    file: str
    line: int
    grid: tuple[int, ...]
    seconds: float
    findings: int
    devices: int = 1
    call_site: SourceFrame | None = None  # the script's line that made the call, if known
    failed: bool = False  # pallas-check could not simulate this call (the run exits 4)
    # The run stopped inside this call (Ctrl-C, SIGTERM, the watchdog): its findings are
    # those made until then; `progress` says how far it got (steps_done, steps_total, and
    # with several schedules schedules_done, schedules_total).
    interrupted: bool = False
    progress: dict[str, int] = field(default_factory=dict)

    def stopped_text(self) -> str:
        """Where an interrupted call stopped: `after 447 of 1000 grid steps (schedule 4 of
        200)`."""
        p = self.progress
        text = f"after {p.get('steps_done', 0)} of {p.get('steps_total', 0)} grid steps"
        if "schedules_total" in p:
            text += f" (schedule {p['schedules_done'] + 1} of {p['schedules_total']})"
        return text
    # --compile: per TPU generation, the compile's status, VMEM footprint and time
    # (tpu_compile.compiler.CompileOutcome.summary()).
    compiled: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Races on: what race checking covered in this call, over all its simulations
    # (schedules, re-runs): `accesses_checked` (memory accesses the race checker checked)
    # and `longest_history` (the most access records one buffer's history held at once;
    # it stays small however long the grid runs, when pruning works). Empty with races off.
    races: dict[str, int] = field(default_factory=dict)
