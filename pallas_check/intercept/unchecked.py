"""Calls `--kernel` and `--calls` do not check: run with every check off.

Such a call's outputs and prints are the script's as in a checked run (intercept/session.py
lists nothing of it and drops what it finds); XLA computes a kernel that needs nothing of
the engine (intercept/xla_path.py), save `--skip-floats`' inf, and several devices meet in
the engine's rendezvous. intercept/judge.py runs a program's calls so when it re-runs it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from pallas_check.checkers import CHECKERS
from pallas_check.config import Config
from pallas_check.engine.call import explore
from pallas_check.engine.call.describe import MeshInfo
from pallas_check.engine.call.explore import CallSetting
from pallas_check.engine.events import KernelPrint
from pallas_check.engine.runtime.backend import engine_device
from pallas_check.intercept.call_filter import CallFilter
from pallas_check.intercept.xla_path import compiled_call
from pallas_check.process.host_memory import collector_paused


class Unchecked:
    """The session's runs of calls passed through, and XLA's computation per structure."""

    def __init__(self, config: Config, call_filter: CallFilter) -> None:
        # Every check that costs time off.
        self.config = dataclasses.replace(
            config, races=False, schedules=1, keep_going=False, check_uninit_outputs=False,
            timeline=False, compile=False)
        self._call_filter = call_filter
        self.xla_paths: dict[str, Any] = {}  # call structure -> xla_path.compiled_call

    def outputs(self, params: dict[str, Any], device_operands: Sequence[Sequence[np.ndarray]],
                mesh: MeshInfo, results: Sequence[np.ndarray] | None, index: int,
                carried: dict[tuple[object, ...], object] | None = None
                ) -> tuple[list[list[np.ndarray]], list[KernelPrint]]:
        """A call's outputs and prints with every check off (`params`: the pallas_call
        primitive's, JAX's own values of any kind)."""
        run_call_devices = explore.run_call_devices  # looked up per call (tests replace it)
        with jax.default_device(engine_device()):
            fast = (self._xla_path(params)
                    if mesh.num_devices == 1 and not self.config.skip_floats else None)
            if fast is not None:
                return [[np.asarray(o) for o in fast(*device_operands[0])]], []
        with jax.default_device(engine_device()), collector_paused():
            result = run_call_devices(params, device_operands, self.config, index,
                                      CallSetting(mesh, carried if carried is not None
                                                  else {}, CHECKERS), results=results)
        return result.outputs, result.prints

    def _xla_path(self, params: dict[str, Any]) -> Any:
        """The call compiled by XLA (intercept/xla_path.py) when its kernel needs nothing
        of the engine, else None; made once per call structure."""
        key = self._call_filter.structure(params)
        if key not in self.xla_paths:
            self.xla_paths[key] = compiled_call(params, self.config.uninit.value)
        return self.xla_paths[key]
