"""Findings are plain data: the engine and checkers create them, reporters render them.

Nothing here prints. A Finding carries everything a reporter needs (kind, buffer, range,
the user's source frames) so that table, JSON and SARIF output are pure functions of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, Union
from urllib.parse import quote

# The kinds and what is said about each live in findings/kinds.py; they are imported from here too.
from pallas_check.findings.kinds import (  # re-exported
    CATALOGUE as CATALOGUE, FindingKind as FindingKind, KindInfo as KindInfo)


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

# What a report writes as JSON: a finding's details, a report's dictionaries. Read-only
# containers (Sequence, Mapping) so that a `list[int]` or a `dict[str, str]` is one.
JsonValue = Union[None, bool, int, float, str, Sequence["JsonValue"], Mapping[str, "JsonValue"]]
JsonObject = dict[str, JsonValue]


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
    details: JsonObject = field(default_factory=dict)
    seed: int | None = None
    count: int = 1
    # How to fix this one defect, where its checker knows (the DMA whose wait is missing,
    # the index map and grid point that chose a block, the blocks no grid point visits):
    # the reports' `help:` line. None: only the kind's general help (findings/kinds.py) applies.
    # Not part of the finding's identity (like `message`).
    help: str | None = None
    # Facts code decides on, typed (not keys of `details`); the JSON and SARIF reports show
    # each one that is set among the details, under its name, as they always have.
    merge: str = ""  # the emitter's own part of the identity: sightings equal in it merge
    generation: str | None = None  # the TPU generation a compiled or reckoned verdict is for
    reckoned: bool = False  # a vmem-exceeded reckoned by pallas-check, not the compiler's
    simulated: bool | None = None  # a vmem-exceeded call: simulated all the same, or not
    skipped: bool = False  # a compile-error the simulation found: the call was skipped
    schedules: tuple[int, int] | None = None  # explored: (schedules showing it, tried)

    # -- identity: when two findings are one defect ------------------------------------
    def identity(self, where: Callable[[tuple[SourceFrame, ...]], tuple[object, ...]]
                 ) -> tuple[object, ...]:
        """The facts two sightings of one defect share: its kind, kernel, buffer, source
        line, the accesses it names and the emitter's own `merge` detail. `where` names a
        source line: exactly within one run (`merge_key`), portably across runs and
        checkouts (`fingerprint`: a path relative to the project and the line's text, so
        that an edit above the kernel does not make an old defect new)."""
        return (self.kind.value, self.kernel.name, self.buffer, self.memory_space,
                where(self.frames),
                tuple((a.operation, a.buffer, where(a.frames)) for a in self.accesses),
                self.merge)

    def merge_key(self) -> tuple[object, ...]:
        """Findings with this key equal are the same defect seen again (e.g. each grid step)."""
        if self.kind == FindingKind.RACE:
            # A race is one pair of accesses, whichever of the two was seen second.
            return (self.kind, self.kernel.name, self.kernel.file, self.buffer,
                    tuple(sorted((a.operation.removeprefix("DMA "), a.frames[:1])
                                 for a in self.accesses)))
        # Within one run the kernel's definition site tells apart two kernels of one name.
        return (self.kernel.file, self.kernel.line, *self.identity(_first_frame))

    def fingerprint(self, root: str | None = None) -> str:
        """A hash that stays the same across runs and checkouts for the same defect (paths
        relative to `root`, default the current folder; a baseline passes its folder).
        The SARIF report's `partialFingerprints` and the baseline file (report/suppress.py) are
        this; changing it makes every accepted finding of every baseline new again."""
        def where(frames: tuple[SourceFrame, ...]) -> tuple[str, ...]:
            if not frames:
                return ()
            f = frames[0]
            return (project_uri(f.file, root)[0], f.function, f.code.strip() or str(f.line))

        text = json.dumps(self.identity(where), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @property
    def location(self) -> SourceFrame | None:
        """The user's source line the finding points at (innermost user frame)."""
        if self.frames:
            return self.frames[0]
        for access in self.accesses:
            if access.frames:
                return access.frames[0]
        return None

    def reported_details(self) -> JsonObject:
        """`details` with the typed facts that are set, as the reports show them."""
        typed: JsonObject = {"merge": self.merge or None, "generation": self.generation,
                 "reckoned": self.reckoned or None, "simulated": self.simulated,
                 "skipped": self.skipped or None,
                 "schedules": list(self.schedules) if self.schedules else None}
        return {**self.details, **{k: v for k, v in typed.items() if v is not None}}

    def to_dict(self) -> JsonObject:
        data = dataclasses.asdict(self)
        for name in _TYPED_FACTS:
            del data[name]
        data["details"] = self.reported_details()
        data["kind"] = self.kind.value
        data["index_range"] = _range_list(self.index_range)
        data["grid_point"] = list(self.grid_point) if self.grid_point is not None else None
        for access in data["accesses"]:
            access["index_range"] = _range_list(access["index_range"])
            if access["grid_point"] is not None:
                access["grid_point"] = list(access["grid_point"])
        return data


_TYPED_FACTS = ("merge", "generation", "reckoned", "simulated", "skipped", "schedules")


def _first_frame(frames: tuple[SourceFrame, ...]) -> tuple[SourceFrame, ...]:
    return frames[:1]


def project_uri(file: str, root: str | None = None) -> tuple[str, bool]:
    """`file` as a URI, and whether it is relative: inside `root` (default the current
    folder) a quoted `/`-separated path relative to it, else an absolute `file:///` URI.
    The fingerprint names files so, and SARIF locates them so (against %SRCROOT%)."""
    root = os.path.abspath(root or os.getcwd())
    absolute = os.path.abspath(file)
    try:
        rel = os.path.relpath(absolute, root)
    except ValueError:  # another drive
        rel = None
    if rel is not None and not rel.startswith(os.pardir):
        return quote(Path(rel).as_posix()), True
    return Path(absolute).as_uri(), False


def _range_list(index_range: IndexRange | None) -> list[list[int]] | None:
    if index_range is None:
        return None
    return [[int(a), int(b)] for a, b in index_range]


class FindingStore:
    """Collects findings of a whole run, merging duplicates; safe across callback threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple[object, ...], Finding] = {}

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

    def holds(self, finding: Finding) -> bool:
        """Whether a sighting of the same defect (the same merge key) is already held."""
        key = finding.merge_key()
        with self._lock:
            return key in self._by_key

    def discard(self, drop: Callable[[Finding], bool]) -> int:
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


def _sort_key(f: Finding) -> tuple[int, str, str, str, int, tuple[int, ...]]:
    loc = f.location
    return (
        f.call_index,
        f.kind.value,
        f.buffer,
        loc.file if loc else "",
        loc.line if loc else 0,
        f.grid_point or (),
    )


@dataclass(frozen=True)
class UnusedMemory:
    """A note of one call (not a finding: it changes no exit code): one of the kernel's
    VMEM/SMEM allocations with elements no read or write of the call touched
    (engine/memory/usage.py says which memory counts and what touched means). `ranges`:
    the untouched part as a few index ranges, empty when it is not that simple."""

    buffer: str
    memory_space: str
    bytes: int  # of the untouched elements (their count times the itemsize)
    of_bytes: int  # of the whole allocation, as the kernel sees it (one pipeline buffer)
    ranges: tuple[IndexRange, ...] = ()

    def text(self) -> str:
        """`scratch_ref [8:16, 0:128] never touched: 4.00 KiB of 8.00 KiB`."""
        where = ", ".join(format_range(r) for r in self.ranges if r) if self.ranges else ""
        where = f" {where}" if where else ("" if self.ranges else " (in parts)")
        return (f"{self.buffer}{where} never touched: {_size(self.bytes)} of"
                f" {_size(self.of_bytes)} {self.memory_space}")

    def to_dict(self) -> JsonObject:
        return {"buffer": self.buffer, "memory_space": self.memory_space,
                "bytes": self.bytes, "of_bytes": self.of_bytes,
                "ranges": [_range_list(r) for r in self.ranges]}


def _size(nbytes: int) -> str:
    """Bytes as a kernel author counts VMEM: B, KiB or MiB with two decimals."""
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1024 * 1024:
        return f"{nbytes / 1024:.2f} KiB"
    return f"{nbytes / (1024 * 1024):.2f} MiB"


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
    compiled: dict[str, JsonObject] = field(default_factory=dict)
    # Races on: what race checking covered in this call, over all its simulations that
    # report (its schedules; the re-runs that only compare outputs check no races):
    # `accesses_checked` (memory accesses the race checker checked)
    # and `longest_history` (the most access records one buffer's history held at once;
    # it stays small however long the grid runs, when pruning works). Empty with races off.
    races: dict[str, int] = field(default_factory=dict)
    # Notes (not findings): the kernel's VMEM/SMEM allocations, or parts, that nothing in
    # the call read or wrote (UnusedMemory; engine/memory/usage.py).
    unused_memory: list[UnusedMemory] = field(default_factory=list)
    # Which way of running produced the call's result (config.Tier): "engine" or
    # "compiled" (the call as one XLA computation). `tier_reason`: for an engine call, why
    # the compiled tier did not run it or handed its result to the engine ("remote DMA",
    # "a verdict bit: out-of-bounds"; empty where there is nothing to say, as under
    # `--tier engine`); for a compiled call, empty. Reports count the calls per tier, so
    # a user sees which calls ran which way.
    tier: str = "engine"
    tier_reason: str = ""
