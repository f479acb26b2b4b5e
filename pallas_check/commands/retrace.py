"""A further TPU generation's run (intercept/generations.py): the script run again in a process of
its own (`python -m pallas_check.commands.retrace REQUEST RESULT`, started by
generations.retrace_in_child), or a test's body run again in this process
(`rerun_in_process`, the pytest plugin's). Each is told that chip, its calls checked as a
`run` checks them (or, for `pallas-check compile`, answered with zeros) and compiled for
that chip alone; what it did comes back as a generations.GenerationRun.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import jax

from pallas_check.commands.compile import CompileOnlyCommand, call_row
from pallas_check.config import Config, TpuGeneration
from pallas_check.process.execfile import ScriptOutcome, run_script
from pallas_check.intercept.generations import GenerationRun, from_session, further_config
from pallas_check.run.runner import _settle_computations, callback_failures
from pallas_check.intercept.session import Session
from pallas_check.tpu_compile.stage import compile_recorded
from pallas_check.tpu_compile.toolchain import start_backends_quietly


def rerun_in_process(block: Callable[[], object], config: Config,
                     generation: TpuGeneration) -> GenerationRun:
    """`block` (a test's body) run again in this process as `generation`, checked and
    compiled for it. JAX's traces are dropped before and after (a jitted function traced
    as the first chip would be reused); what the test's module computed when it was
    imported stays as the first chip made it."""
    session = Session(further_config(config, generation))
    outcome = ScriptOutcome(ok=True)
    jax.clear_caches()
    started = time.perf_counter()
    try:
        with callback_failures() as ours, session.install():
            try:
                block()
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - the block's own failure (pytest's
                # own are BaseExceptions), noted in the report
                outcome = ScriptOutcome(ok=False, error=f"{type(exc).__name__}: {exc}")
            _settle_computations()
        return from_session(session, outcome, ours, generation,
                            time.perf_counter() - started, own_process=False)
    finally:
        jax.clear_caches()


def _trace_here(script: str, args: Sequence[str], config: Config | None,
                generation: TpuGeneration) -> GenerationRun:
    """In the child: the script's run as `generation` (see `retrace_in_child`)."""
    start_backends_quietly(compiling=True)
    if config is None:
        return _compiled_here(script, args, generation)
    session = Session(further_config(config, generation))
    started = time.perf_counter()
    with callback_failures() as ours, session.install():
        outcome = run_script(script, args)
        _settle_computations()
    return from_session(session, outcome, ours, generation, time.perf_counter() - started,
                        own_process=True)


def _compiled_here(script: str, args: Sequence[str],
                   generation: TpuGeneration) -> GenerationRun:
    """`pallas-check compile --tpu GEN`'s run, as data."""
    command = CompileOnlyCommand(script, (generation,), args)
    started = time.perf_counter()
    with callback_failures() as ours, command.installed():
        outcome = run_script(script, args)
        _settle_computations()
    if ours:
        return GenerationRun(generation.value, time.perf_counter() - started, True, [],
                             internal_error=ours[0])
    seconds = time.perf_counter() - started
    calls = sorted(command.recorder.calls, key=lambda c: c.index)
    result = compile_recorded(calls, (generation,))
    rows = [call_row(c, result.by_call.get(c.index, {})) for c in calls]
    return GenerationRun(generation.value, seconds, True,
                         result.findings, rows=rows, calls=len(calls),
                         script_error=None if outcome.ok else outcome.error)


def _main(argv: Sequence[str]) -> int:
    """`python -m pallas_check.commands.retrace REQUEST RESULT` (generations.retrace_in_child's
    child). What it pickles is of other modules (generations.GenerationRun, findings):
    the parent finds them by their own names."""
    request, result = Path(argv[0]), Path(argv[1])
    script, args, config, generation = pickle.loads(request.read_bytes())
    try:
        run = _trace_here(script, args, config, generation)
    except Exception as exc:  # noqa: BLE001 - ours: the parent reports it, exit 4
        run = GenerationRun(generation.value, 0.0, True, [],
                            internal_error=f"{type(exc).__name__}: {exc}")
    for finding in run.findings:  # plain data only: nothing of JAX's crosses over
        finding.details = {k: v for k, v in finding.details.items()
                           if isinstance(v, (str, int, float, bool, list, dict, type(None)))}
    result.write_bytes(pickle.dumps(run))
    sys.stdout.flush()
    os._exit(0)  # the script may leave JAX work behind: nothing more to wait for


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
