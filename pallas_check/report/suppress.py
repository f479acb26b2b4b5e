"""Suppressions and a baseline: which findings a team has accepted. A stage of its own,
between the analysis (session findings) and the report; neither the engine nor a reporter
decides what is suppressed.

Tried in this order for each finding (the first that applies is the one reported):

- inline: `# pallas-check: ignore[race]` (kinds comma-separated; bare `ignore`: every kind)
  on the line the finding points at, or on the line of one of the accesses it lists;
- def-line: the same comment on the kernel's `def` line, for the whole kernel;
- config: `ignore = ["race:ag_kernel", "semaphore-leak:*/vendor/*"]` in
  `[tool.pallas-check]` (or `--ignore`): KIND (or `*`) : a kernel name or a path glob;
- baseline: `--baseline FILE`, the stable fingerprints (`Finding.fingerprint`, which
  SARIF reports too) of accepted findings; `--update-baseline` writes it.

An inline comment inside a kernel the run checked that matched nothing is reported as an
`unused-suppression` finding (like ruff's unused-noqa), unless every kind it names is one
the run did not look for (`race` without `--races`). Such a finding counts like any other;
config and baseline can suppress it, comments cannot.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import fnmatch
import functools
import io
import json
import os
import re
import tokenize
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from pallas_check.config.errors import SuppressionError
from pallas_check.findings.finding import (CallSummary, Finding, FindingKind, JsonObject, KernelInfo,
                                   SourceFrame)
from pallas_check.report.run_report import Suppression
from pallas_check.report.paths import display_path
from pallas_check.report.schema import SchemaError, check_schema

COMMENT = re.compile(r"pallas-check:\s*ignore\b(?:\[([^\]]*)\])?")
KINDS = frozenset(kind.value for kind in FindingKind)
# Kinds that only an option makes the run look for (findings/kinds.py): a comment for them is not
# "unused" in a run that did not look.
NEEDS_OPTION = {kind.value: kind.info.needs_option for kind in FindingKind
                if kind.info.needs_option}
BASELINE_SCHEMA = "pallas-check/baseline"
BASELINE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Comment:
    """One `# pallas-check: ignore[...]` comment."""

    file: str
    line: int
    kinds: frozenset[str] | None  # None: every kind
    text: str  # as written, e.g. "pallas-check: ignore[race]"

    def covers(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


@dataclasses.dataclass(frozen=True)
class IgnoreRule:
    """One config entry, KIND:TARGET, TARGET a kernel name or a path glob."""

    kind: str
    target: str
    text: str

    def matches(self, finding: Finding, cwd: str) -> bool:
        if self.kind not in ("*", finding.kind.value):
            return False
        if fnmatch.fnmatchcase(finding.kernel.name, self.target):
            return True
        files = {finding.kernel.file} | ({finding.location.file} if finding.location else set())
        for file in filter(None, files):
            absolute = os.path.abspath(file)
            relative = os.path.relpath(absolute, cwd)
            for path in (absolute, relative):
                if fnmatch.fnmatchcase(Path(path).as_posix(), self.target):
                    return True
        return False


def parse_rule(text: str) -> IgnoreRule:
    """`race:ag_kernel` -> IgnoreRule (SuppressionError names a bad entry)."""
    kind, sep, target = text.partition(":")
    kind, target = kind.strip(), target.strip()
    if not sep or not target:
        raise SuppressionError(f"ignore entry {text!r}: expected KIND:KERNEL or"
                               f" KIND:PATH-GLOB, e.g. \"race:my_kernel\"")
    if kind != "*" and kind not in KINDS:
        raise SuppressionError(f"ignore entry {text!r}: unknown kind {kind!r} (kinds:"
                               f" {', '.join(sorted(KINDS))}, or *)")
    return IgnoreRule(kind, target, text)


@dataclasses.dataclass(frozen=True)
class Policy:
    """What a run suppresses, read and checked before the script runs."""

    rules: tuple[IgnoreRule, ...] = ()
    baseline: Path | None = None
    known: frozenset[str] = frozenset()  # the baseline's fingerprints
    entries: tuple[JsonObject, ...] = ()  # the baseline's entries, as read
    update_baseline: bool = False
    report_unused: bool = True  # the pytest plugin checks one test at a time: off there
    options: frozenset[str] = frozenset()  # options on in this run that find more kinds


def make_policy(ignore: Iterable[str] | None, baseline: Path | None,
                update_baseline: bool, races: bool, report_unused: bool = True) -> Policy:
    """The policy of a run (raises SuppressionError for a bad entry or baseline)."""
    if update_baseline and baseline is None:
        raise SuppressionError("--update-baseline needs --baseline FILE (where to write it)")
    rules = tuple(parse_rule(text) for text in ignore or ())
    entries: tuple[JsonObject, ...] = ()
    if baseline is not None:
        baseline = Path(os.path.abspath(baseline))
        if baseline.exists() or not update_baseline:
            entries = tuple(read_baseline(baseline))
    return Policy(rules, baseline, frozenset(str(e["fingerprint"]) for e in entries), entries,
                  update_baseline, report_unused,
                  frozenset({"races"} if races else set()))


def read_baseline(path: Path) -> list[JsonObject]:
    """The entries of a baseline file (SuppressionError when missing or malformed)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuppressionError(f"baseline not found: {path} (write it with"
                               f" --update-baseline)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SuppressionError(f"cannot read the baseline {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SuppressionError(f"baseline {path} is not JSON: {exc}") from None
    try:
        # A baseline started by hand ({"schema": ..., "findings": []}) is version 1.
        check_schema(data, path, BASELINE_SCHEMA, (BASELINE_VERSION,), "baseline",
                     unversioned=1)
    except SchemaError as exc:
        raise SuppressionError(str(exc)) from None
    entries = data.get("findings")
    if (not isinstance(entries, list)
            or not all(isinstance(e, dict) and isinstance(e.get("fingerprint"), str)
                       for e in entries)):
        raise SuppressionError(f"{path} is not a pallas-check baseline (schema"
                               f" {BASELINE_SCHEMA!r} with a list of findings)")
    return entries


@dataclasses.dataclass
class Outcome:
    active: list[Finding]
    suppressed: list[tuple[Finding, Suppression]]


def apply(findings: Sequence[Finding], calls: Sequence[CallSummary], policy: Policy,
          cwd: str | None = None) -> Outcome:
    """Split the run's findings into those that count and those suppressed (and by what);
    unused inline comments become findings of their own."""
    cwd = os.path.abspath(cwd or os.getcwd())
    comments = _Comments()
    used: set[tuple[str, int]] = set()
    active: list[Finding] = []
    suppressed: list[tuple[Finding, Suppression]] = []
    for finding in findings:
        found = _inline(finding, comments)
        if found is None:
            active.append(finding)
            continue
        used.add((found[1].file, found[1].line))
        suppressed.append((finding, found[0]))
    if policy.report_unused:
        active.extend(_unused(calls, comments, used, policy.options))
    remaining: list[Finding] = []
    for finding in active:
        rule = next((r for r in policy.rules if r.matches(finding, cwd)), None)
        if rule is not None:
            suppressed.append((finding, Suppression("config", rule.text)))
        elif policy.baseline is not None and (
                policy.update_baseline
                or finding.fingerprint(str(policy.baseline.parent)) in policy.known):
            suppressed.append((finding, Suppression("baseline", _shown(policy.baseline,
                                                                        cwd))))
        else:
            remaining.append(finding)
    return Outcome(remaining, suppressed)


def _shown(path: Path, cwd: str) -> str:
    relative = os.path.relpath(path, cwd)
    return str(path) if relative.startswith(os.pardir) else relative


def _inline(finding: Finding, comments: "_Comments"
            ) -> tuple[Suppression, Comment] | None:
    """The comment suppressing `finding` where it points, else on its kernel's def line."""
    frames: list[SourceFrame] = [finding.location] if finding.location else []
    frames += [a.frames[0] for a in finding.accesses if a.frames]
    for frame in frames:
        comment = comments.at(frame.file, frame.line)
        if comment is not None and comment.covers(finding.kind.value):
            return Suppression("inline", f"{_display(frame.file)}:{frame.line}"), comment
    kernel = finding.kernel
    if kernel.file:
        span = function_span(kernel.file, kernel.line)
        for line in {kernel.line, span[0] if span else kernel.line}:
            comment = comments.at(kernel.file, line)
            if comment is not None and comment.covers(finding.kind.value):
                return Suppression("def-line", f"{_display(kernel.file)}:{line}"), comment
    return None


def _display(file: str) -> str:
    return display_path(file)


def _unused(calls: Sequence[CallSummary], comments: "_Comments",
            used: set[tuple[str, int]], options: frozenset[str]) -> list[Finding]:
    """A finding per comment inside a checked kernel that suppressed nothing."""
    out: list[Finding] = []
    seen: set[tuple[str, int]] = set()
    for call in sorted(calls, key=lambda c: c.index):
        if call.failed or not call.file or (call.file, call.line) in seen:
            continue
        seen.add((call.file, call.line))
        in_file = comments.in_file(call.file)
        span = function_span(call.file, call.line) if in_file else None
        if span is None:  # no comment in the file (the usual case): nothing to parse
            continue
        kernel = KernelInfo(call.kernel, call.file, call.line)
        for line, comment in sorted(in_file.items()):
            if not span[0] <= line <= span[1] or (call.file, line) in used:
                continue
            message = _unused_message(comment, options)
            if message is None:
                continue
            code = comments.line_text(call.file, line)
            out.append(Finding(FindingKind.UNUSED_SUPPRESSION, message, kernel, call.index,
                               frames=(SourceFrame(call.file, line, call.kernel, code),),
                               merge=comment.text))
    return out


def _unused_message(comment: Comment, options: frozenset[str]) -> str | None:
    """What is wrong with an unused comment (None: not checkable in this run)."""
    unknown = sorted((comment.kinds or frozenset()) - KINDS)
    if unknown:
        return (f"`# {comment.text}` names no finding kind ({', '.join(unknown)});"
                f" kinds: {', '.join(sorted(KINDS))}")
    if comment.kinds is not None and all(NEEDS_OPTION.get(k) not in (None, *options)
                                         for k in comment.kinds):
        return None  # e.g. ignore[race] in a run without --races: nothing to say
    return f"`# {comment.text}` matched no finding in this run: remove it"


class _Comments:
    """The `pallas-check: ignore` comments of the files a run touched, read once each."""

    def __init__(self) -> None:
        self._by_file: dict[str, dict[int, Comment]] = {}
        self._lines: dict[str, list[str]] = {}

    def in_file(self, file: str) -> dict[int, Comment]:
        found = self._by_file.get(file)
        if found is None:
            found = self._by_file[file] = _scan(file, self._text(file))
        return found

    def at(self, file: str, line: int) -> Comment | None:
        return self.in_file(file).get(line)

    def line_text(self, file: str, line: int) -> str:
        lines = self._lines.get(file, [])
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    def _text(self, file: str) -> str:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        self._lines[file] = text.splitlines()
        return text


def _scan(file: str, text: str) -> dict[int, Comment]:
    """Comments only (tokenize), so a string that mentions the syntax suppresses nothing."""
    found: dict[int, Comment] = {}
    if "pallas-check:" not in text:
        return found
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                  if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return found
    for token in tokens:
        match = COMMENT.search(token.string)
        if match is None:
            continue
        kinds = None if match.group(1) is None else frozenset(
            k.strip() for k in match.group(1).split(",") if k.strip())
        found[token.start[0]] = Comment(file, token.start[0], kinds, match.group(0))
    return found


@functools.lru_cache(maxsize=256)
def function_span(file: str, line: int) -> tuple[int, int] | None:
    """(def line, last line) of the function defined at `line` (its def or a decorator)."""
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if first <= line <= node.lineno:
                return node.lineno, node.end_lineno or node.lineno
    return None


# -- the baseline file ---------------------------------------------------------------------

def baseline_entries(findings: Iterable[Finding], root: Path, script: str
                     ) -> list[JsonObject]:
    """One entry per fingerprint, with what a reviewer needs to read the diff."""
    entries: dict[str, JsonObject] = {}
    for finding in findings:
        where = finding.location
        fp = finding.fingerprint(str(root))
        entries.setdefault(fp, {
            "fingerprint": fp,
            "kind": finding.kind.value,
            "kernel": finding.kernel.name,
            "buffer": finding.buffer,
            "file": _relative_to(where.file, root) if where else "",
            "code": where.code.strip() if where else "",
            "script": _relative_to(script, root),
        })
    return list(entries.values())


def _relative_to(file: str, root: Path) -> str:
    relative = os.path.relpath(os.path.abspath(file), root)
    return Path(relative if not relative.startswith(os.pardir)
                else os.path.abspath(file)).as_posix()


def update_baseline(policy: Policy, findings: Sequence[Finding], script: str,
                    write: Callable[[Path, str], None]) -> None:
    """`--update-baseline`: write this script's findings into the baseline, keeping every
    other script's entries as the file holds them NOW, not as this run read them at its
    start: under an exclusive lock the file is read again, merged and written (`write`,
    outfile.write_report: atomically), so that scripts (or CI jobs) updating one baseline
    in parallel each keep their entries. Raises SuppressionError when the file became
    unreadable meanwhile, OSError when it cannot be written."""
    assert policy.baseline is not None
    with _locked(policy.baseline):
        entries = (tuple(read_baseline(policy.baseline)) if policy.baseline.exists()
                   else ())
        merged = dataclasses.replace(policy, entries=entries)
        write(policy.baseline, baseline_text(merged, findings, script))


@contextlib.contextmanager
def _locked(baseline: Path) -> Iterator[None]:
    """An exclusive `flock` on the folder the baseline file is replaced in (its link's
    target's folder, as deliver/outfile.py replaces it). Not on the file itself: an atomic write
    replaces the file, and a lock on the old one would not exclude a writer that opened
    the new one; not on a lock file beside it, which would be left in the user's tree.
    Where the folder cannot be locked (no fcntl, a filesystem that refuses), the update
    runs unlocked, as it did before, rather than failing."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        yield
        return
    try:
        fd = os.open(os.path.dirname(os.path.realpath(baseline)) or ".", os.O_RDONLY)
    except OSError:
        yield  # the folder is not there: the write reports that, one line
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # e.g. a network filesystem without flock: unlocked, as before
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def baseline_text(policy: Policy, findings: Iterable[Finding], script: str) -> str:
    """The updated baseline: this script's entries replaced, other scripts' kept (a hook
    checking several scripts shares one file); sorted, one key order, so diffs are small."""
    assert policy.baseline is not None
    root = policy.baseline.parent
    mine = _relative_to(script, root)
    kept = [e for e in policy.entries if e.get("script") not in (mine, None)]
    entries = kept + baseline_entries(findings, root, script)
    unique = {(e.get("script", ""), e["fingerprint"]): e for e in entries}
    ordered = sorted(unique.values(), key=lambda e: (
        str(e.get("file", "")), str(e.get("kind", "")), str(e.get("kernel", "")),
        str(e.get("buffer", "")), e["fingerprint"], str(e.get("script", ""))))
    data: JsonObject = {"schema": BASELINE_SCHEMA, "schema_version": BASELINE_VERSION,
                      "findings": ordered}
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
