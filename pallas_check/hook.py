"""`pallas-check hook`: check a kernel repository's scripts, as a pre-commit hook does.

The scripts are those `[tool.pallas-check]` names in the nearest pyproject.toml
(`scripts = [...]` and/or `pattern = "kernels/*_check.py"`, relative to that file's folder).
Each one runs in its own `python -m pallas_check run SCRIPT` process, from the pyproject's
folder, so it reads the same table for its options and no JAX state passes from one script
to the next. The exit code is the worst of theirs (4 > 3 > 2 > 1 > 0); a bad table is 2
before anything runs.

The file names pre-commit passes are not used to choose scripts: a change to any Python
file (a kernel module a script imports, say) can change what a script finds, so every
configured script is checked whenever the hook runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Sequence

from pallas_check.exitcodes import ExitCode
from pallas_check.settings import Settings, SettingsError, load_settings

_WHAT = {0: "clean", 1: "findings", 2: "usage or configuration error",
         3: "the script failed", 4: "pallas-check failed"}


def _error(message: str) -> ExitCode:
    print(f"pallas-check: error: {message}", file=sys.stderr)
    return ExitCode.USAGE


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
    from pallas_check.cli import run

    try:
        settings = load_settings(run)
        if settings.path is None or not settings.has_table:
            where = settings.path or "the current directory or its parents"
            return _error(f"no [tool.pallas-check] table in {where}: name the scripts to"
                          f" check with scripts = [...] or pattern = \"...\"")
        if not settings.scripts and not settings.patterns:
            return _error(f"{settings.path}: [tool.pallas-check] names no script: add"
                          f" scripts = [...] or pattern = \"...\"")
        scripts = configured_scripts(settings)
    except SettingsError as exc:
        return _error(str(exc))
    root = settings.root
    worst = 0
    results: list[tuple[str, int]] = []
    for script in scripts:
        try:
            shown = str(script.relative_to(root.resolve()))
        except ValueError:
            shown = str(script)
        print(f"pallas-check hook: {shown}", flush=True)
        sys.stderr.flush()
        proc = subprocess.run([sys.executable, "-m", "pallas_check", "run", shown], cwd=root)
        code = proc.returncode if proc.returncode in _WHAT else int(ExitCode.INTERNAL)
        results.append((shown, code))
        worst = max(worst, code)
    for shown, code in results:
        print(f"pallas-check hook: {shown}: exit {code} ({_WHAT[code]})")
    return ExitCode(worst)
