"""The other sides `pallas-check diff --against` names beside the hardware: JAX's HLO
interpreter (`hlo`), JAX's TPU interpreter (`jax-interpret`), and another configuration of
ours (options in quotes); `parse_against` reads the option (commands/diff.py compares)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import shlex
import threading
from typing import Any, NoReturn

import jax
import numpy as np

from pallas_check.commands.diff import NativeSide, Side
from pallas_check.config import Config
from pallas_check.config.errors import UsageError
from pallas_check.config.options import BY_PARAM
from pallas_check.intercept.session import Session
from pallas_check.jaxbridge import hlo_interpreter, tpu_interpret_params, tpu_interpreter
from pallas_check.run.runner import config_dict

class _JaxInterpreterSide(Side):
    """A JAX interpreter, jitted once per lowered call and run on the call's operands."""

    def __init__(self) -> None:
        self._jitted: dict[int, tuple[dict, Any]] = {}
        self._lock = threading.Lock()

    def _function(self, params: dict) -> Any:
        raise NotImplementedError

    def outputs(self, params, operands, device, mesh_axes, native):
        if mesh_axes and int(np.prod([s for _, s in mesh_axes])) > 1:
            raise RuntimeError(f"a call inside shard_map over several devices cannot be"
                               f" compared against {self.label}")
        with self._lock:
            # `params` is the same dict for every run of one lowered call.
            entry = self._jitted.get(id(params))
            if entry is None:
                entry = self._jitted[id(params)] = (params, jax.jit(self._function(params)))
        return [np.asarray(x) for x in entry[1](*operands)]


def _accepted(fn: Any, params: dict) -> dict:
    names = inspect.signature(fn).parameters
    return {k: v for k, v in params.items() if k in names}


class HloSide(_JaxInterpreterSide):
    label = "hlo"

    def _function(self, params):
        fn = hlo_interpreter().pallas_call_hlo_interpret
        return functools.partial(fn, **_accepted(fn, params))


class JaxInterpretSide(_JaxInterpreterSide):
    label = "jax-interpret"

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config

    def interpret_params(self) -> Any:
        return tpu_interpret_params()(uninitialized_memory=self.config.uninit.value,
                               dma_execution_mode=self.config.dma_mode.value)

    def config_dict(self):
        return {k: v for k, v in dataclasses.asdict(self.interpret_params()).items()
                if isinstance(v, (int, float, str, bool, type(None)))}

    def _function(self, params):
        fn = tpu_interpreter().interpret_pallas_call
        return functools.partial(fn, interpret_params=self.interpret_params(),
                                 **_accepted(fn, params))


class ConfigSide(Side):
    """Our engine again, with another Config; its findings are not reported."""

    same_prng = True

    def __init__(self, config: Config, text: str) -> None:
        self.config = config
        self.label = text
        # Not reported, and not heard: the kernels' prints are our own side's to write.
        self.session = Session(dataclasses.replace(config, check_uninit_outputs=False,
                                                   quiet_prints=True))

    def outputs(self, params, operands, device, mesh_axes, native):
        return [np.asarray(x) for x in
                self.session.handle_call(params, operands, device, mesh_axes)]

    def config_dict(self):
        return config_dict(self.config)


# The options of ours `--against "..."` takes (declared in options.py): those that change
# what one simulation computes, and `--tier` (the compiled tier held to the engine:
# `--tier compiled --against "--tier engine"`; any difference is ours).
AGAINST_OPTIONS = tuple(BY_PARAM[name] for name in ("dma", "tier", "uninit", "skip_floats",
                                                    "races", "cores", "seed"))


def _option_parser() -> argparse.ArgumentParser:
    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # never print, never exit
            raise UsageError(message)

    p = Parser(prog="--against", add_help=False, allow_abbrev=False)
    for option in AGAINST_OPTIONS:
        if option.kind is bool:
            p.add_argument(option.flags[0], dest=option.param, action="store_true",
                           default=None)
            p.add_argument(f"--no-{option.key}", dest=option.param, action="store_false")
        else:
            typed: dict[str, Any] = ({"choices": option.choices} if option.choices
                                     else {"type": option.kind})  # (the other: its default)
            p.add_argument(option.flags[0], dest=option.param, **typed)
    return p


def _against_help() -> str:
    return ", ".join(f"--[no-]{o.key}" if o.kind is bool else o.flags[0]
                     for o in AGAINST_OPTIONS)


def parse_against(text: str | None, config: Config) -> Side:
    """The comparison side named by `--against` (None: the hardware)."""
    text = (text or "native").strip()
    if text == "native":
        return NativeSide()
    if text == "hlo":
        return HloSide()
    if text == "jax-interpret":
        return JaxInterpretSide(config)
    if not text.startswith("-"):
        raise UsageError(f"unknown --against {text!r} (choose native, hlo, jax-interpret or"
                         f" options of ours such as \"--uninit zero\")")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--against {text!r}: {exc}") from None
    try:
        ns = _option_parser().parse_args(words)
    except UsageError as exc:
        raise UsageError(f"--against {text!r}: {exc} (options allowed there:"
                         f" {_against_help()})") from None
    changes: dict[str, Any] = {}
    for option in AGAINST_OPTIONS:
        value = getattr(ns, option.param)
        if value is None:
            continue
        if option.minimum is not None and value < option.minimum:
            raise UsageError(f"--against {text!r}: {option.flags[0]} must be at least"
                             f" {option.minimum}")
        assert option.config_field is not None  # each of AGAINST_OPTIONS sets one
        changes[option.config_field] = option.kind(value)
    other = dataclasses.replace(config, **changes)
    if other == config:
        raise UsageError(f"--against {text!r} is the configuration already in use;"
                         f" nothing would differ")
    return ConfigSide(other, " ".join(words))
