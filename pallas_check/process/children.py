"""Processes the script starts: only the process that started the run reports.

A script may start processes of its own: `os.fork`, or multiprocessing, whose default start
method on Linux is 'fork' (before Python 3.14; 'spawn' and 'forkserver' start fresh
interpreters). Only the process that started the run (its owner) reports, handles Ctrl-C
and SIGTERM and writes the run's outputs; a child never does:

- A forked child begins as a copy of the owner in the middle of the run: our signal
  handlers, the watchdog's wakeup descriptor, the wrapped `os._exit`, the session. What the
  owner set up is undone in every child forked while the run is active (`undone_in_child`,
  run from `os.register_at_fork`): a pool worker that `Pool.terminate` sends SIGTERM ends
  as it would without pallas-check (it raised KeyboardInterrupt from our handler, printed
  its traceback, and some stayed alive holding the run's stdout); a signal a child gets
  no longer reaches the owner's watchdog (the run ended "interrupted (Ctrl-C twice)",
  exit 3); and a child that comes to the end of the script ends there (`end_if_child`)
  without a report (each pool worker wrote one: three JSON objects on stdout, and a
  worker's partial one replaced the owner's `-o` file).
- JAX cannot compile in a process forked after it started: the child has the parent's
  locks and none of its threads (JAX warns so at the fork; the compilation hangs). In a
  child forked after JAX started, a compilation -- a pallas_call's first of all -- fails
  at once with one line (`ForkedProcessError`) instead of hanging the run; a call that
  reaches our callback there is refused the same way (intercept/session.py). pallas-check starts
  JAX before the script when libtpu is installed, to keep its chatter off the terminal.
  A child forked before JAX started checks its own calls, as a spawned one does.
- A 'spawn' or 'forkserver' child is a fresh interpreter that imports the script as
  `__mp_main__`. The preparation data multiprocessing sends it carries a `_ChildStart`
  whose unpickling, before the script's module is imported, installs a session of the
  run's configuration (run/spawned.py; it ran the script's pallas_calls unintercepted:
  "Only interpret mode is supported on CPU backend").
- A child that checks calls writes what it found (its calls and their findings) to the
  run's folder after each call (`ChildFindings`); the owner adopts it when it reports
  (`adopt_children`): one report, a child's calls numbered after the owner's.
- A run that was stopped (Ctrl-C, SIGTERM, the watchdog) ends the processes the script
  left running (`end_children`): none outlives the run holding its stdout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn, Protocol, Sequence

from pallas_check.deliver.delivery import flush_streams, note
from pallas_check.process import interrupts
from pallas_check.process.execfile import ScriptOutcome

if TYPE_CHECKING:
    from pallas_check.config import Config
    from pallas_check.findings.finding import CallSummary, Finding

_real_exit = os._exit  # a run wraps os._exit (run/runner.py); a child ends for real
_KEY = "pallas_check_child"  # our entry in multiprocessing's preparation data


class ForkedProcessError(RuntimeError):
    """A compilation or pallas_call in a process forked after JAX started (it would hang)."""


FORKED_JAX = ("pallas-check: JAX cannot compile in a process forked after JAX started"
              " (os.fork, or multiprocessing's 'fork' start method): it would hang; start"
              " the process with multiprocessing.get_context('spawn') (pallas-check checks"
              " its pallas_calls too)")


@dataclasses.dataclass
class _Run:
    owner: int  # the pid of the process that started the run
    child_start: _ChildStart | None  # what a spawned child unpickles (None: its calls
    # are not ours)
    folder: Path | None = None  # where checking children put what they found (made
    # when the first child is started: most runs start none)

    def made_folder(self) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="pallas-check-children-"))
        return self.folder


_run: list[_Run] = []  # the active run of this process (at most one)
_undo: list[Callable[[], None]] = []  # what a forked child undoes of the run, in order
_state = {"child": False, "jax_refused": False}


def run_folder() -> Path | None:
    """Where the active run's checking children put what they found (None: no run, no
    child started yet, or a command whose children's calls are not checked)."""
    return _run[0].folder if _run and _run[0].child_start is not None else None


def in_child() -> bool:
    """Whether this process was forked from the owner of a run while the run was active."""
    return _state["child"]


def jax_refused() -> bool:
    """Whether this process was forked after JAX started (it cannot compile)."""
    return _state["jax_refused"]


@contextlib.contextmanager
def owned(child_config: Config | None = None, starter: Callable[..., None] | None = None,
          prints_to_stderr: bool = False) -> Iterator[None]:
    """While active, this process owns a run: children forked or spawned meanwhile are
    told apart (above). `child_config`: the Config a spawned child checks its calls with,
    `starter(config, folder, prints_to_stderr, platform)` what starts that there (a
    module's function, pickled by name: spawned.start_spawned_child); None: a command
    whose children's calls are not checked. `prints_to_stderr`: a machine-readable report
    owns stdout, so a spawned child's prints go to stderr too."""
    run = _Run(os.getpid(), None)
    if child_config is not None and starter is not None:
        run.child_start = _ChildStart(starter, child_config, run, prints_to_stderr)
    _run.append(run)
    restore = _carried_into_spawned(run.child_start)
    try:
        yield
    finally:
        restore()
        _run.clear()
        if run.folder is not None:
            shutil.rmtree(run.folder, ignore_errors=True)


@contextlib.contextmanager
def undone_in_child(undo: Callable[[], None]) -> Iterator[None]:
    """While active, `undo()` runs first thing in a child forked during a run (it must
    not import, nor take a lock another thread may hold: it runs right after the fork)."""
    _undo.append(undo)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            _undo.remove(undo)


def _after_fork_in_child() -> None:
    if not _run:  # no run active: a fork outside one is none of ours
        return
    _state["child"] = True
    # Undone first, before anything slower: until the watchdog's wakeup socket and the
    # signal handlers are the child's own, a signal the child gets (Pool.terminate's
    # SIGTERM to a worker it just forked) reaches the owner's watchdog, which ends the run
    # as interrupted, and raises KeyboardInterrupt here, which cut the undoing short.
    stopped = _undo_in_child()
    if _jax_started():
        _state["jax_refused"] = True
        _refuse_compiles()
    if stopped is not None:  # (the child's own handler is back: it acts as it would have)
        os.kill(os.getpid(), stopped)


def _undo_in_child() -> int | None:
    """Each undo step, newest first; a stop that interrupts one (our handler, not yet
    undone) is taken, the step done again, and its signal returned to be sent again."""
    stopped: int | None = None
    undo, _undo[:] = list(reversed(_undo)), []
    for step in undo:
        for _ in range(3):
            try:
                step()
                break
            except KeyboardInterrupt:
                stopped = interrupts.latest() or signal.SIGINT
            except Exception:  # noqa: BLE001 - a child goes on with what could be undone
                break
    return stopped


def _jax_started() -> bool:
    """Whether JAX's runtime has threads in this (parent's) memory: its backends, or the
    engine's private client, started. Only modules already imported are looked at."""
    bridge = sys.modules.get("pallas_check.jaxbridge")
    backend = sys.modules.get("pallas_check.engine.runtime.backend")
    return bool((bridge is not None and bridge.backends_started())
                or (backend is not None and backend.started()))


def _refuse_compiles() -> None:
    bridge = sys.modules["pallas_check.jaxbridge"]

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise ForkedProcessError(FORKED_JAX)

    bridge.refuse_compiles(refuse)


def _before_fork() -> None:
    """In the owner, about to fork: the folder a child that checks calls writes to (one
    forked after JAX started checks none)."""
    if (_run and _run[0].child_start is not None and _run[0].owner == os.getpid()
            and not _jax_started()):
        with contextlib.suppress(OSError):
            _run[0].made_folder()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def end_if_child(outcome: ScriptOutcome) -> None:
    """In a forked child, the end of the script is the end of the process (no report,
    none of the run's outputs, no exit handlers of the parent's JAX): its exit status is
    the script's, and a crash is one line on stderr. In the owner, nothing."""
    if not in_child():
        return
    if not outcome.ok and outcome.traceback:
        note(f"pallas-check: the script's forked process {os.getpid()} failed:"
             f" {outcome.error}")
    code = 0 if outcome.ok else outcome.exit_code if outcome.exit_code is not None else 1
    flush_streams()
    _real_exit(code)


# -- spawned children -------------------------------------------------------------------

class _ChildStart:
    """Rides in the preparation data of a spawned child: unpickling it there calls the
    starter, which starts the child's checking session."""

    def __init__(self, starter: Callable[..., None], config: Config, run: _Run,
                 prints_to_stderr: bool) -> None:
        self.starter, self.config, self.run = starter, config, run
        self.prints_to_stderr = prints_to_stderr

    def __reduce__(self) -> tuple[Callable[..., None], tuple[Config, str, bool, str | None]]:
        folder = str(self.run.made_folder())
        return (self.starter, (self.config, folder, self.prints_to_stderr, _platform()))


def _platform() -> str | None:
    """The platform the owner's JAX runs on, once started (a spawned child runs there
    too: run/spawned.py)."""
    bridge = sys.modules.get("pallas_check.jaxbridge")
    try:
        if bridge is not None and bridge.backends_started():
            return str(bridge.default_backend_name())
    except Exception:  # noqa: BLE001 - never a failure of the script's Pool: not known
        pass
    return None


def _carried_into_spawned(start: _ChildStart | None) -> Callable[[], None]:
    """multiprocessing's preparation data (spawn and forkserver children get it) carry
    `start` while the run is active; returns what restores it."""
    if start is None:
        return lambda: None
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def with_our_start(name: str) -> dict[str, object]:
        data: dict[str, object] = original(name)
        data[_KEY] = start
        return data

    spawn.get_preparation_data = with_our_start

    def restore() -> None:
        if spawn.get_preparation_data is with_our_start:
            spawn.get_preparation_data = original

    return restore


# -- what children found ----------------------------------------------------------------

class ChildFindings:
    """A child's calls and findings, for the owner: rewritten whole after each call into
    `<folder>/<pid>.pickle` (a new file renamed over the old: the owner reads a whole
    one, whenever it reports). A folder the owner already removed (it reported) is no
    error of the child's."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.first: int | None = None  # when the child's first call ended (its order)

    def write(self, calls: Sequence[CallSummary], findings: Sequence[Finding]) -> None:
        if self.first is None:
            self.first = time.monotonic_ns()
        data = {"first": self.first, "pid": os.getpid(), "calls": calls,
                "findings": findings}
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "wb") as handle:
                pickle.dump(data, handle)
            os.replace(tmp, self.folder / f"{os.getpid()}.pickle")
        except OSError:
            pass


class Adopter(Protocol):
    """What takes a child's calls and findings in: the owner's session."""

    def adopt(self, calls: Sequence[CallSummary], findings: Sequence[Finding]) -> None: ...


def adopt_children(session: Adopter, folder: Path | None) -> None:
    """The calls and findings of the run's children into `session` (the owner's), in the
    order the children made their first call; the folder is removed (the owner reports
    once; it may end without its exit handlers, e.g. by the watchdog)."""
    if folder is None or not folder.is_dir():
        return
    found = []
    for path in folder.glob("*.pickle"):
        try:
            with open(path, "rb") as handle:
                found.append(pickle.load(handle))
            path.unlink()
        except (OSError, pickle.UnpicklingError, EOFError):
            continue
    shutil.rmtree(folder, ignore_errors=True)
    for data in sorted(found, key=lambda d: (d["first"], d["pid"])):
        session.adopt(data["calls"], data["findings"])


# -- processes left running -------------------------------------------------------------

END_GRACE_S = 2.0


def end_children(grace_s: float = END_GRACE_S) -> None:
    """End the processes this one started that still run: SIGTERM, then SIGKILL for
    those alive `grace_s` seconds later (a child that ignores SIGTERM)."""
    pids = _child_pids()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _running(pid)]
        if pids:
            time.sleep(0.02)  # polling the children's state, nothing else to wait on
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _child_pids() -> list[int]:
    """This process's children: the kernel's list (Linux), else multiprocessing's."""
    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as handle:
                pids.update(int(p) for p in handle.read().split())
        return sorted(pids)
    except OSError:
        pass
    if "multiprocessing" in sys.modules:
        import multiprocessing

        pids.update(p.pid for p in multiprocessing.active_children() if p.pid)
    return sorted(pids)


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet waited for, does not)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):  # gone
            return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
