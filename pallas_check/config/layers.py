"""Project settings: `[tool.pallas-check]` in pyproject.toml, then `PALLAS_CHECK_*` variables.

Precedence, lowest first: the option's default < the pyproject table < the environment <
a flag given on the command line. The keys are the long option names of `pallas-check run`
without their dashes (`dma`, `skip-floats` or `skip_floats`, `format`, ...), and the
variables' names, taken from their one declaration in options.py, so an option added there
can be set here with no change to this module. The table may also name the scripts the pre-commit hook checks (`scripts`, `pattern`).

Nothing here imports JAX. Every error is a `SettingsError` naming the key and the file (or
the variable); the command line turns it into one line and exit 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

from pallas_check.config.environment import (CACHE_VARIABLE, COMPILER_ABORT_VARIABLE,
                                              DEBUG_VARIABLE, ENV_PREFIX, env_variable,
                                              parse_flag)
from pallas_check.config.options import Option
from pallas_check.config.errors import SettingsError

TABLE = "pallas-check"
HOOK_KEYS = ("scripts", "pattern")  # read by `pallas-check hook`, ignored by `run`
# Variables with our prefix that are not options: a traceback for bug reports, where
# compiled programs are kept, and the TPU compile worker's test hook (tpu_compile/remote.py).
OTHER_VARIABLES = (DEBUG_VARIABLE, CACHE_VARIABLE, COMPILER_ABORT_VARIABLE)


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One option of a command, as a settings key: its parameter name and value type."""

    key: str  # e.g. "skip-floats"
    name: str  # the command function's parameter, e.g. "skip_floats"
    kind: type | None  # bool, int, float, str, Path, list (of str), an Enum subclass
    minimum: int | float | None = None
    check: Callable[[str], object] | None = None  # a further check of the value (raises ValueError)

    @property
    def env(self) -> str:
        return env_variable(self.key)


@dataclasses.dataclass
class Settings:
    """What the pyproject table and the environment set."""

    path: Path | None = None  # the pyproject.toml that was read, if any
    has_table: bool = False  # whether it has a [tool.pallas-check] table
    # By parameter name, each of its option's type (checked_value): read by name.
    values: dict[str, Any] = dataclasses.field(default_factory=dict)  # Any: see above
    origins: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> where from
    scripts: list[str] = dataclasses.field(default_factory=list)
    patterns: list[str] = dataclasses.field(default_factory=list)

    @property
    def root(self) -> Path:
        """Where relative paths of the table are resolved: the pyproject's folder."""
        return self.path.parent if self.path is not None else Path.cwd()


def option_specs(command: object) -> dict[str, OptionSpec]:
    """The settings keys of a command, one per option (not per argument): from its
    options.py declaration, given as the tuple of options (`RUN_OPTIONS`) or as a command
    function that `options.with_options` declared them on (`cli.run`)."""
    declared: tuple[Option, ...] = (command if isinstance(command, tuple)
                                    else getattr(command, "__pallas_check_options__"))
    return {o.key: OptionSpec(o.key, o.param, _kind(o.kind), o.minimum, o.check)
            for o in declared}


def _kind(annotation: object) -> type | None:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if annotation in (bool, int, float, str, Path):
        return annotation
    if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
        return list  # a list of strings (e.g. `ignore`)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation
    return None


def find_pyproject(start: Path | None = None) -> Path | None:
    """The first pyproject.toml in `start` (default: the current directory) or a parent."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def normalize_key(key: str) -> str:
    return key.strip().replace("_", "-")


def checked_value(spec: OptionSpec, value: Any,  # Any: TOML, env or API input, unchecked
                  from_env: bool, base: Path | None) -> object:
    """A checked value, in the form a command-line default takes (raises ValueError):
    `from_env`, a variable's text; `base`, the folder a relative path is relative to."""
    kind = spec.kind
    if kind is bool:
        if isinstance(value, bool):
            return value
        if from_env:  # 1/true/yes/on or 0/false/no/off (environment.parse_flag)
            return parse_flag(value)
        raise ValueError("expected true or false")
    if kind in (int, float):
        if isinstance(value, bool):
            raise ValueError(f"expected {'an integer' if kind is int else 'a number'}")
        if from_env or isinstance(value, str):
            try:
                value = kind(str(value).strip())
            except ValueError:
                raise ValueError(f"expected {'an integer' if kind is int else 'a number'},"
                                 f" got {value!r}") from None
        if kind is int and not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        if kind is float and not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {value!r}")
        if spec.minimum is not None and value < spec.minimum:
            raise ValueError(f"must be at least {spec.minimum}")
        value = kind(value)
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        choices = [str(m.value) for m in kind]
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
    elif kind is list:
        if from_env:  # a variable holds one string: comma-separated entries
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"expected a list of strings, got {value!r}")
    elif kind in (str, Path):
        if not isinstance(value, str) or (kind is Path and not value):
            raise ValueError(f"expected {'a path' if kind is Path else 'a string'},"
                             f" got {value!r}")
        if kind is Path and base is not None:
            value = str(base / value)  # a path in pyproject.toml is relative to its folder
    if spec.check is not None:
        spec.check(value)
    return value


def _string_list(key: str, value: object, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SettingsError(f"{where}: [tool.{TABLE}] {key}: expected a path or a list of"
                            f" paths, got {value!r}")
    return list(value)


def read_table(path: Path) -> dict[str, object] | None:
    """The `[tool.pallas-check]` table of `path` (None if it has none)."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise SettingsError(f"{path}: cannot be read: {exc.strerror}") from None
    tool = data.get("tool", {})
    table = tool.get(TABLE) if isinstance(tool, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: tool.{TABLE} must be a table ([tool.{TABLE}])")
    return table


def load_settings(command: object, cwd: Path | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    """Settings for `command`: a command function declared by options.py (`cli.run`) or a
    tuple of its declarations (`RUN_OPTIONS`, for the hook, the API and the pytest plugin).

    Reads the nearest pyproject.toml from `cwd` up, then `PALLAS_CHECK_<KEY>` variables;
    a variable with the prefix that names no option (a typo) is an error, not ignored.
    """
    specs = option_specs(command)
    environ = os.environ if environ is None else environ
    settings = Settings(path=find_pyproject(cwd))
    if settings.path is not None:
        table = read_table(settings.path)
        if table is not None:
            settings.has_table = True
            _apply_table(settings, specs, table)
    known = {spec.env for spec in specs.values()} | set(OTHER_VARIABLES)
    for variable in sorted(environ):
        if variable.startswith(ENV_PREFIX) and variable not in known:
            close = difflib.get_close_matches(variable, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise SettingsError(f"unknown environment variable {variable}{hint} (known:"
                                f" {', '.join(sorted(known))})")
    check_other_variables(environ)
    for spec in specs.values():
        if spec.env in environ:
            try:
                settings.values[spec.name] = checked_value(spec, environ[spec.env], True, None)
            except ValueError as exc:
                raise SettingsError(f"environment variable {spec.env}: {exc}") from None
            settings.origins[spec.name] = spec.env
    return settings


def check_other_variables(environ: Mapping[str, str] | None = None) -> None:
    """Our variables that are no option, checked like an option's: PALLAS_CHECK_DEBUG is
    yes or no (`0` is off); any other value is a SettingsError naming it (exit 2)."""
    environ = os.environ if environ is None else environ
    if DEBUG_VARIABLE in environ:
        try:
            parse_flag(environ[DEBUG_VARIABLE])
        except ValueError as exc:
            raise SettingsError(f"environment variable {DEBUG_VARIABLE}: {exc}") from None


def _apply_table(settings: Settings, specs: dict[str, OptionSpec],
                 table: dict[str, object]) -> None:
    path = settings.path
    assert path is not None  # only a file's table is applied (load_settings)
    seen: dict[str, str] = {}
    for raw_key, value in table.items():
        key = normalize_key(raw_key)
        if key in seen:
            raise SettingsError(f"{path}: [tool.{TABLE}] sets {key!r} twice"
                                f" ({seen[key]!r} and {raw_key!r})")
        seen[key] = raw_key
        if key == "scripts":
            settings.scripts = _string_list(raw_key, value, str(path))
            continue
        if key == "pattern":
            settings.patterns = _string_list(raw_key, value, str(path))
            absolute = [p for p in settings.patterns if os.path.isabs(p)]
            if absolute:  # globs are relative to this file's folder (pathlib refuses others)
                raise SettingsError(f"{path}: [tool.{TABLE}] pattern {absolute[0]!r} is"
                                    " absolute; write it relative to this file's folder")
            continue
        spec = specs.get(key)
        if spec is None:
            known = ", ".join(sorted([*specs, *HOOK_KEYS]))
            raise SettingsError(f"{path}: [tool.{TABLE}] unknown key {raw_key!r}"
                                f" (known keys: {known})")
        try:
            settings.values[spec.name] = checked_value(spec, value, False, path.parent)
        except ValueError as exc:
            raise SettingsError(f"{path}: [tool.{TABLE}] {raw_key}: {exc}") from None
        settings.origins[spec.name] = str(path)


def default_map(settings: Settings) -> dict[str, object]:
    """The values as a click `default_map` for the command (flags still override them)."""
    return {name: (v.value if isinstance(v, enum.Enum) else v)
            for name, v in settings.values.items()}
