"""The chip's compile in a worker process, so that libtpu's compiler aborting is a finding.

Why: libtpu's compiler (0.0.42) aborts its process on some kernels (a failed internal
`Check failed: ...`, SIGABRT): `samples/cross_call_dma_ok.py`'s first call, which returns
DMA semaphores, ends any process that compiles it, a TPU host's too. Compiled in
pallas-check's own process (as `--compile` and the default run's compile at each call did),
that abort ended the run with no report. Here the compile runs in one worker process per
pallas-check process, started at the first compile that the outcome cache does not answer
(a warm run starts none) and kept for every later one; a worker that dies is replaced at
the next compile. A worker killed by a signal is the compiler's verdict on that call
(`Answer.crashed`, with the `Check failed` line it wrote on its stderr); a worker that fails
for a reason of ours (`Unavailable`) leaves the call to the parent's own compile.

What travels: the call exported for the TPU in the parent (`jax.export`, the Pallas TPU
lowering run there with the generation's compile-only device as JAX's default device:
jaxbridge/export.py), by name the compile-only topology to compile on, and the shard_map
axes of a call placed on several chips. The worker lowers `jax.jit(exported.call)` on
ShapeDtypeStructs placed on that topology's devices and compiles it; back come the scoped
VMEM bytes the compiled kernels use, or what the compile raised: the exception's class (by
module and name), its arguments and its message, so that the program is given the same
class as when the parent compiled.

Test hook: PALLAS_CHECK_TEST_COMPILER_ABORT=<kernel name> makes the worker abort as libtpu
does (a `Check failed` line, then SIGABRT) instead of compiling a call of that kernel; the
crash path is tested without a kernel that really crashes the compiler.

Run as `python -m pallas_check.tpu_compile.remote` (the worker's side: jobs on stdin, one
answer each on stdout, length-prefixed pickles, engine/runtime/bounded_compile.py's frames).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, TYPE_CHECKING, Any, Callable, Hashable

from pallas_check.config.environment import COMPILER_ABORT_VARIABLE, debug_requested
from pallas_check.engine.runtime.bounded_compile import receive_frame, send_frame
from pallas_check.jaxbridge.export import lowered_on_tpu
from pallas_check.tpu_compile.toolchain import quiet_environment

if TYPE_CHECKING:
    import jax

_USED_SCOPED = re.compile(r'"used_scoped_memory_configs":\[([^\]]*)\]')
# A fatal line of libtpu's log (glog): "F1207 06:56:27.575640   25052 file.cc:1534] text".
_FATAL = re.compile(r"^F\d{4} [\d:.]+\s+\d+ [^\]]*\] (.*)$", re.MULTILINE)
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")
# The signals a process dies of by its own fault (libtpu's `Check failed` is SIGABRT): the
# compiler's crash. Any other (SIGKILL, SIGTERM: from outside) is not the kernel's doing.
_FAULTS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL,
                     signal.SIGFPE, signal.SIGTRAP})

# Off: every compile in the parent's own process, as before the worker (benchmarks/ compare).
enabled = True


def scoped_use(hlo_text: str) -> int:
    """The scoped VMEM (memory space 1) the compiled kernels use, the largest of them."""
    used = 0
    for configs in _USED_SCOPED.findall(hlo_text):
        try:
            entries = json.loads(f"[{configs}]")
        except ValueError:
            continue
        for entry in entries:
            if str(entry.get("memory_space")) == "1":
                used = max(used, int(entry.get("size", 0)))
    return used


class ChipCompilerAborted(RuntimeError):
    """What the program gets at a call whose compile libtpu's compiler aborted on: on a TPU
    host that compile ends the process; pallas-check raises this at the call instead (as
    it raises the toolchain's own exception for a call the chip refuses) and goes on."""


class Unavailable(Exception):
    """The worker could not take the call, for a reason of ours (it could not start, or
    not place the call): the parent compiles it itself."""


@dataclasses.dataclass(frozen=True)
class Job:
    """One call to compile: exported (jaxbridge/export.py), the topology by name, and the
    shard_map axes ((name, size) pairs: a mesh of that many of its devices; empty: one)."""

    exported: bytes
    topology: str
    mesh_axes: tuple[tuple[Hashable, int], ...] = ()
    abort: bool = False  # the test hook (module docstring)


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the worker's compile came to: compiled (`scoped_bytes`), raised (`error_class`
    and `error_args`: the exception's, for a new one in this process; `message` its text),
    or crashed (`signal_name`, and `last_words`: the fatal line the compiler wrote before
    it died)."""

    scoped_bytes: int | None = None
    error_class: type[Exception] | None = None
    error_args: tuple[object, ...] = ()
    message: str = ""
    crashed: bool = False
    signal_name: str = ""
    last_words: str = ""


def last_words(stderr_text: str) -> str:
    """The compiler's fatal line in what a dead worker wrote: the `Check failed` line
    (libtpu's glog `F` line, its prefix dropped), or the last fatal line, or "". Addresses
    (`this=0x55c1...`) are blanked: a report says the same run to run."""
    fatal = _FATAL.findall(stderr_text)
    checks = [line for line in fatal if "Check failed" in line]
    found = [line for line in stderr_text.splitlines() if "Check failed" in line]
    said = checks[0] if checks else fatal[-1] if fatal else found[0] if found else ""
    return _ADDRESS.sub("0x...", said.strip())


def _rebuilt(module: str, qualname: str, args_blob: bytes, message: str
             ) -> tuple[type[Exception], tuple[object, ...]]:
    """The worker's exception's class in this process (found by module and name) and its
    arguments (unpickled), or RuntimeError and its message where this process cannot."""
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        args = pickle.loads(args_blob)
        if isinstance(found, type) and issubclass(found, Exception) and \
                isinstance(args, tuple):
            return found, args
    except Exception:  # noqa: BLE001 - a class this process cannot find: its text
        pass
    return RuntimeError, (message,)


class _Worker:
    """The process's compile worker, started at its first job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._owner = 0  # the pid that started it (a forked child starts its own)
        self.started = 0  # workers started by this process (a crash starts another)
        self.jobs = 0  # calls sent to a worker by this process
        self._broken = ""  # why it cannot run at all, once known: every call stays here

    def _started(self, warm: str = "") -> subprocess.Popen[bytes]:
        if self._process is not None and self._owner == os.getpid() and \
                self._process.poll() is None:
            return self._process
        self._release()
        self._stderr = tempfile.TemporaryFile()
        # The worker compiles for compile-only devices only: no backend of its own (on a
        # TPU host the parent may hold the chip); libtpu's chatter into its stderr file.
        env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
        env[_WARM_VARIABLE] = warm
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        except OSError as exc:
            self._broken = f"the TPU compile worker could not start: {exc}"
            raise Unavailable(self._broken) from exc
        self._owner = os.getpid()
        self.started += 1
        return self._process

    def prestart(self, topology: str) -> None:
        """Start the worker now, without waiting for it, making `topology`'s compile-only
        devices as it starts: a first compile then finds it ready (python, JAX and libtpu
        started on another core meanwhile: about a second)."""
        with self._lock:
            if self._broken or (self._process is not None and self._owner == os.getpid()
                                and self._process.poll() is None):
                return
            try:
                self._started(warm=topology)
            except Unavailable:
                pass

    def compile(self, job: Job, meanwhile: Callable[[], None] | None = None) -> Answer:
        """`job` compiled by the worker, `meanwhile` run here while it compiles; raises
        Unavailable where it cannot be."""
        with self._lock:
            if self._broken:
                raise Unavailable(self._broken)
            process = self._started()
            assert process.stdin is not None and process.stdout is not None
            self.jobs += 1
            try:
                # (a dict: the worker runs this module as __main__, whose Job is not ours)
                send_frame(process.stdin, dataclasses.asdict(job))
                if meanwhile is not None:
                    meanwhile()  # (its own failures are its own: it must not raise)
                reply = receive_frame(process.stdout)
            except (EOFError, OSError, pickle.UnpicklingError):
                return self._ended(process)
        assert isinstance(reply, tuple)
        if reply[0] == "ok":
            return Answer(scoped_bytes=reply[1])
        if reply[0] == "raised":
            _, module, qualname, args_blob, message = reply
            cls, args = _rebuilt(module, qualname, args_blob, message)
            return Answer(error_class=cls, error_args=args, message=message)
        raise Unavailable(f"the TPU compile worker could not place the call: {reply[1]}")

    def _ended(self, process: subprocess.Popen[bytes]) -> Answer:
        """The worker died on a job: by a signal, the compiler's crash; else ours."""
        code = process.wait()
        text = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            text = self._stderr.read().decode("utf-8", "replace")
            if debug_requested():
                sys.stderr.write(text)
        self._release()
        if -code in _FAULTS:
            return Answer(crashed=True, signal_name=signal.Signals(-code).name,
                          last_words=last_words(text))
        if code < 0:  # killed from outside (SIGKILL, SIGTERM): the next call starts another
            raise Unavailable(f"the TPU compile worker was killed by signal {-code}")
        tail = text.strip().splitlines()[-1:] or ["no message"]
        self._broken = f"the TPU compile worker exited with {code}: {tail[0]}"
        raise Unavailable(self._broken)

    def _release(self) -> None:
        """A dead worker's pipes and stderr file closed (a forked child's copies too)."""
        process, self._process = self._process, None
        for stream in (process.stdin, process.stdout) if process is not None else ():
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def stop(self) -> None:
        """The worker told to end (its stdin closed) and waited for; at exit."""
        process, self._process = self._process, None
        if process is None or self._owner != os.getpid():
            return
        try:
            if process.stdin is not None:
                process.stdin.close()
            if not self.jobs:  # started ahead and never needed: not waited for
                process.kill()
            process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()


# The topology a worker started ahead of its first job makes as it starts.
_WARM_VARIABLE = "PALLAS_CHECK_WORKER_TOPOLOGY"
_worker = _Worker()
atexit.register(_worker.stop)


def prestart(topology: str) -> None:
    """Start this process's worker ahead of its first job (see `_Worker.prestart`)."""
    _worker.prestart(topology)


def compile_in_worker(job: Job, meanwhile: Callable[[], None] | None = None) -> Answer:
    """`job` compiled by this process's worker (started when first needed); `meanwhile`
    runs in this process while the worker compiles (on another core)."""
    return _worker.compile(job, meanwhile)


def workers_started() -> int:
    """How many workers this process has started (a warm run: none)."""
    return _worker.started


def jobs_sent() -> int:
    """How many calls this process has sent to a worker (the outcome cache's hits: none)."""
    return _worker.jobs


def abort_requested(kernel_name: str) -> bool:
    """Whether the test hook names this kernel (module docstring)."""
    return bool(kernel_name) and os.environ.get(COMPILER_ABORT_VARIABLE) == kernel_name


# -- the worker's side ------------------------------------------------------------------


def _devices(name: str) -> tuple[jax.Device, ...]:
    from jax.experimental import topologies

    cached = _topologies.get(name)
    if cached is None:
        cached = _topologies[name] = tuple(topologies.get_topology_desc(name, "tpu").devices)
    return cached


_topologies: dict[str, tuple[Any, ...]] = {}


def _sharding(job: Job) -> tuple[Any, jax.Device]:
    """Where the call's operands live: one compile-only device, or every device of a
    mesh over the call's shard_map axes (replicated: each holds its per-device block)."""
    import math

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = _devices(job.topology)
    if not job.mesh_axes:
        return jax.sharding.SingleDeviceSharding(devices[0]), devices[0]
    sizes = tuple(size for _, size in job.mesh_axes)
    mesh = Mesh(np.array(devices[: math.prod(sizes)]).reshape(sizes),
                tuple(name for name, _ in job.mesh_axes))
    return NamedSharding(mesh, PartitionSpec()), devices[0]


def _answer(job: Job) -> tuple[object, ...]:
    """("ok", scoped bytes | None), ("raised", module, class name, pickled args,
    message), or ("ours", why): a failure before the compile is ours, not the chip's."""
    import jax

    try:
        sharding, device = _sharding(job)
        with jax.default_device(device):
            lowered = lowered_on_tpu(job.exported, sharding)
    except Exception as exc:  # noqa: BLE001 - ours: the parent compiles the call itself
        return ("ours", f"{type(exc).__name__}: {exc}")
    if job.abort:
        sys.stderr.write("F0000 00:00:00.000000       0 remote.py:0] Check failed: the test"
                         " hook's abort (PALLAS_CHECK_TEST_COMPILER_ABORT)\n")
        sys.stderr.flush()
        os.abort()
    try:
        with jax.default_device(device):
            compiled = lowered.compile()
    except Exception as exc:  # noqa: BLE001 - the compiler's verdict, sent back
        try:
            args_blob = pickle.dumps(tuple(exc.args))
        except Exception:  # noqa: BLE001 - arguments that do not pickle: the text
            args_blob = pickle.dumps((str(exc),))
        cls = type(exc)
        return ("raised", cls.__module__, cls.__qualname__, args_blob, str(exc))
    text = compiled.as_text()
    return ("ok", scoped_use(text) if text is not None else None)


def _serve() -> None:
    """The worker: each job's answer, until stdin ends. Its own stdout carries only the
    answers (descriptor 1 is pointed at stderr: stray prints cannot corrupt a frame); no
    core file is written when the compiler aborts; an interrupt (Ctrl-C reaches the whole
    process group) is left to the parent, which ends the worker at its exit."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ValueError, OSError):
        pass
    quiet_environment(compiling=True)  # (the parent's settings, inherited: where unset)
    import jax.experimental.pallas.tpu  # noqa: F401 - Mosaic's error handler (MosaicError)

    if os.environ.get(_WARM_VARIABLE):  # started ahead: the first job's devices made now
        try:
            _devices(os.environ[_WARM_VARIABLE])
        except Exception:  # noqa: BLE001 - the job that needs them says what is wrong
            pass

    jobs = sys.stdin.buffer
    while True:
        try:
            job = receive_frame(jobs)
        except EOFError:
            return
        assert isinstance(job, dict)
        send_frame(answers, _answer(Job(**job)))


if __name__ == "__main__":
    _serve()
