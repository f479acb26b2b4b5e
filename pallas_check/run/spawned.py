"""What a process the script spawns during a run does first: check its pallas_calls.

multiprocessing's 'spawn' and 'forkserver' children are fresh interpreters; process/children.py
has the one the run's owner spawns unpickle a call of `start_spawned_child` before the
script's module is imported there (as `__mp_main__`). Its session checks every call with
the run's configuration and hands each call's findings to the owner (process/children.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pallas_check.process.children import ChildFindings
from pallas_check.deliver.delivery import note
from pallas_check.tpu_compile.toolchain import start_backends_quietly

if TYPE_CHECKING:
    from pallas_check.config import Config

_kept: list[contextlib.ExitStack] = []  # the session stays installed until the child exits


def start_spawned_child(config: Config, folder: str, prints_to_stderr: bool,
                        platform: str | None = None) -> None:
    """Intercept this process's pallas_calls into a session of `config` whose findings go
    to `folder`. `prints_to_stderr`: a machine-readable report owns the run's stdout;
    `platform`: where the owner's JAX runs ("cpu" without a TPU: libtpu is not loaded
    here, whose start is slow, chatty, and installs crash handlers that print a stack
    trace when a pool ends its workers). A failure leaves the calls unchecked, one line."""
    try:
        if prints_to_stderr:
            sys.stdout = sys.stderr
        if platform is not None and "jax" not in sys.modules:
            os.environ.setdefault("JAX_PLATFORMS", platform)
        from pallas_check.intercept.session import Session  # lazy: JAX must see JAX_PLATFORMS first

        if platform is None:
            start_backends_quietly()  # libtpu's start-up chatter off the terminal
        session = Session(config)
        session.findings_for_owner = ChildFindings(Path(folder))
        stack = contextlib.ExitStack()
        stack.enter_context(session.install())
        _kept.append(stack)
    except Exception as exc:  # noqa: BLE001 - the child runs on, its calls unchecked
        note(f"pallas-check: the script's process {os.getpid()} runs its pallas_calls"
             f" unchecked: {type(exc).__name__}: {exc}")
