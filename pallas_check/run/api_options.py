"""The Python API's options (api.py `checking(**options)`, the pytest plugin's flags):
checked as the command line checks them and merged over the project's settings.

Apart from api.py because the pytest plugin resolves them when pytest starts, before it
sets `--pallas-check-devices` in XLA_FLAGS and imports the run (api.py brings JAX).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
from pathlib import Path
from typing import Any, Mapping

from pallas_check.config import Config
from pallas_check.config.layers import checked_value, load_settings, option_specs
from pallas_check.config.options import RUN_OPTIONS, config_from
from pallas_check.config.errors import PallasCheckError
from pallas_check.report.suppress import Policy, make_policy

# Options of `run` that mean nothing around a block of code in a running process: its
# report format and file (the Run object is the report), --native (another command),
# --trace (a file written by the CLI), and --devices (JAX already chose its device count).
_NOT_HERE = ("fmt", "output", "native", "trace", "devices", "update_baseline")
OPTIONS = {o.key.replace("-", "_"): o for o in RUN_OPTIONS if o.param not in _NOT_HERE}
# The Config field names as aliases of the keys (`dma_mode=` for `dma=`).
_ALIASES = {o.config_field: name for name, o in OPTIONS.items()
            if o.config_field and o.config_field != name}


@dataclasses.dataclass(frozen=True)
class Options:
    """Checked options: the engine's Config and the suppression policy."""

    config: Config
    policy: Policy


def resolve(options: Mapping[str, object], project: bool | str | Path = True,
            report_unused: bool = False) -> Options:
    """Options as `checking` takes them, checked and merged over the project's settings
    (raises ValueError, one line; TypeError for a name that is no option)."""
    values: dict[str, Any] = {}  # Any: by name, each option's own type (read by name)
    if project is not False:
        cwd = None if project is True else Path(project)
        try:
            values = dict(load_settings(RUN_OPTIONS, cwd=cwd).values)
        except PallasCheckError as exc:  # a bad table or variable: the API's one line
            raise ValueError(str(exc)) from None
    specs = {spec.name: spec for spec in option_specs(RUN_OPTIONS).values()}
    for name, value in options.items():
        name = _ALIASES.get(name, name)
        option = OPTIONS.get(name)
        if option is None:
            close = difflib.get_close_matches(name, [*OPTIONS, *_ALIASES], n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise TypeError(f"pallas_check.checking() got an unknown option {name!r}{hint}"
                            f" (options: {', '.join(OPTIONS)})")
        try:
            values[option.param] = checked_value(specs[option.param], _plain(value), False,
                                                 None)
        except ValueError as exc:
            raise ValueError(f"{name}={value!r}: {exc}") from None
    try:
        races = bool(values.get("races", OPTIONS["races"].default))
        policy = make_policy(values.get("ignore"), values.get("baseline"), False, races,
                             report_unused=report_unused)
    except PallasCheckError as exc:
        raise ValueError(str(exc)) from None
    return Options(_config(values), policy)


def _plain(value: object) -> object:
    """An enum member as its value, a Path as a string, a tuple as a list: as a
    `[tool.pallas-check]` table would hold them."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _config(values: Mapping[str, object]) -> Config:
    """The Config of the options that mean something here (a `devices` set in the
    project's table does not: JAX already chose its device count)."""
    # An option not given takes its own default, as on the command line: where that differs
    # from a bare Config's (the chip's compile and arithmetic, on in every run), the run's.
    given = {o.param: o.default for o in RUN_OPTIONS if o.config_field is not None}
    given.update(values)
    return config_from({name: value for name, value in given.items()
                        if name not in _NOT_HERE})
