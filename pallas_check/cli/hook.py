"""`pallas-check hook`: check a kernel repository's scripts, as a pre-commit hook does.

The scripts are those `[tool.pallas-check]` names in the nearest pyproject.toml
(`scripts = [...]` and/or `pattern = "kernels/*_check.py"`, relative to that file's folder).
Each one runs in its own `python -m pallas_check run SCRIPT` process, from the pyproject's
folder, so it reads the same table for its options and no JAX state passes from one script
to the next. The exit code is the worst of theirs (4 > 3 > 2 > 1 > 5 > 0); a bad table is 2
before anything runs.

The file names pre-commit passes are not used to choose scripts: a change to any Python
file (a kernel module a script imports, say) can change what a script finds, so every
configured script is checked whenever the hook runs.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from pallas_check.config import exitcodes
from pallas_check.config.layers import Settings, load_settings
from pallas_check.config.options import RUN_OPTIONS
from pallas_check.config.errors import PallasCheckError, SettingsError
from pallas_check.deliver.outfile import OutputError, check_target, write_report
from pallas_check.config.exitcodes import ExitCode
from pallas_check.config.formats import Format
from pallas_check.findings.units import plural

_WHAT: dict[int, str] = {ExitCode.CLEAN: "clean", ExitCode.FINDINGS: "findings",
         ExitCode.USAGE: "usage or configuration error",
         ExitCode.USER_ERROR: "the script failed", ExitCode.INTERNAL: "pallas-check failed",
         ExitCode.NO_CALLS: "no pallas_call was checked"}


def _error(message: str, code: ExitCode = ExitCode.USAGE) -> ExitCode:
    print(f"pallas-check: error: {message}", file=sys.stderr)
    return code


def configured_scripts(settings: Settings) -> list[Path]:
    """The scripts the table names, in order, without repeats (raises SettingsError)."""
    root = settings.root
    found: list[Path] = []
    for name in settings.scripts:
        path = root / name
        if not path.is_file():
            raise SettingsError(f"{settings.path}: [tool.pallas-check] scripts: no such"
                                f" file: {name}")
        found.append(path)
    for pattern in settings.patterns:
        matches = sorted(p for p in root.glob(pattern) if p.is_file())
        if not matches and not settings.scripts:
            raise SettingsError(f"{settings.path}: [tool.pallas-check] pattern {pattern!r}"
                                f" matches no file")
        found.extend(matches)
    unique: dict[Path, None] = {}
    for path in found:
        unique.setdefault(path.resolve(), None)
    return list(unique)


def run_hook(files: Sequence[str] = ()) -> ExitCode:
    """Check every configured script in its own process; the worst exit code."""

    try:
        settings = load_settings(RUN_OPTIONS)
        if settings.path is None or not settings.has_table:
            where = settings.path or "the current directory or its parents"
            return _error(f"no [tool.pallas-check] table in {where}: name the scripts to"
                          f" check with scripts = [...] or pattern = \"...\"")
        if not settings.scripts and not settings.patterns:
            return _error(f"{settings.path}: [tool.pallas-check] names no script: add"
                          f" scripts = [...] or pattern = \"...\"")
        scripts = configured_scripts(settings)
        output = settings.values.get("output")
        if output is not None:  # a report that cannot be written is refused before any run
            check_target(Path(output))
    except PallasCheckError as exc:  # a bad table or --output: its line, its exit code
        return _error(str(exc), exc.exit_code)
    root = settings.root
    fmt = str(getattr(settings.values.get("fmt"), "value", settings.values.get("fmt"))
              or "table")
    worst = ExitCode.CLEAN
    results: list[tuple[str, int]] = []
    with tempfile.TemporaryDirectory(prefix="pallas-check-hook-") as parts_dir:
        parts: list[tuple[str, Path]] = []
        for number, script in enumerate(scripts):
            try:
                shown = str(script.relative_to(root.resolve()))
            except ValueError:
                shown = str(script)
            print(f"pallas-check hook: {shown}", flush=True)
            sys.stderr.flush()
            command = [sys.executable, "-m", "pallas_check", "run", shown]
            if output is not None:
                # Each script's report goes to a part of its own; one merged report is
                # written to `output` at the end (otherwise each would overwrite the last).
                part = Path(parts_dir) / f"{number}.report"
                command += ["--output", str(part)]
                parts.append((shown, part))
            proc = subprocess.run(command, cwd=root)
            code = proc.returncode if proc.returncode in _WHAT else int(ExitCode.INTERNAL)
            results.append((shown, code))
            worst = exitcodes.worst((worst, code))
        if output is not None:
            worst = exitcodes.worst((worst, _write_merged(Path(output), fmt, parts)))
    for shown, code in results:
        print(f"pallas-check hook: {shown}: exit {code} ({_WHAT[code]})")
    return ExitCode(worst)


def _write_merged(output: Path, fmt: str, parts: list[tuple[str, Path]]) -> ExitCode:
    """One report for every script, merged as the format merges them (config/formats.py
    `Format.merged`: SARIF with one run per script, JSON with every script's report under
    `reports`, table and text one after the other)."""
    texts = [(shown, part.read_text(encoding="utf-8")) for shown, part in parts
             if part.exists()]
    try:
        text = Format(fmt).merged(texts)
    except ValueError as exc:  # a report of another pallas-check (or not one at all)
        print(f"pallas-check: error: cannot merge the scripts' reports: {exc}",
              file=sys.stderr)
        return ExitCode.USAGE
    try:
        check_target(output)
        write_report(output, text)
    except (OSError, OutputError) as exc:
        print(f"pallas-check: error: cannot write the hook's report to {output}: {exc}",
              file=sys.stderr)
        return ExitCode.USAGE
    print(f"pallas-check hook: report of {plural(len(texts), 'script')} written to {output}")
    return ExitCode.CLEAN
