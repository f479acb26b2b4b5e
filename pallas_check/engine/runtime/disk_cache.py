"""Our own XLA executables kept on disk between processes.

Why: a test suite runs each kernel's first call in a fresh process (every pytest run,
every xdist worker), and the compiled tier's executable for one call structure takes
0.7-2 s of XLA compile (paged attention: 2.1 s of a 2.8 s build). The same structure
lowers to the same program in every process, so its executable is compiled once and read
back later (about a millisecond).

The script's own plain programs are kept too, apart (`ScriptPrograms`, in `programs/`):
jaxbridge/program_store.py hands it each program by what it is, before lowering (salted
here with pallas-check's code, JAX's versions and this CPU: `identity_key`), or, where that
is refused, JAX's compile of it under JAX's own key; JAX's persistent cache itself stays as
the script configured it (off by default for programs that compile in under a second, and
its file store writes entries in place).

Safe to share: an entry's key is the program's text and signature (its arguments' and
results' types: the text drops an unused argument), the compile options, the JAX and
jaxlib versions and this machine's CPU (XLA compiles for the host's instruction set), so
nothing compiled elsewhere or by another JAX is read. Entries are written to a temporary
file and renamed (xdist workers may write one key at once); an entry that cannot be read
is removed and compiled again; past `_LIMIT_BYTES` the least recently used go.

A structure whose build overran its budget (intercept/builds.py) is recorded here too, as a
small `<key>.abandoned` file keyed like an entry (the structure, the versions, this CPU and
the tier's own code), so that no later process tries that compile again (`abandon`,
`abandoned`).

`PALLAS_CHECK_CACHE_DIR` names the folder (default `$XDG_CACHE_HOME/pallas-check/xla`,
else `~/.cache/pallas-check/xla`); `off` turns the cache off. A folder that cannot be
written is no error: the program is compiled as it would be without a cache.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pickle
import platform
import tempfile
import threading
from pathlib import Path
from typing import Mapping

import jax
import jaxlib
from jax.experimental import serialize_executable

from pallas_check.config.environment import CACHE_VARIABLE
from pallas_check.jaxbridge import program_store

ENV = CACHE_VARIABLE
_LIMIT_BYTES = 512 * 2**20
_PROGRAMS_LIMIT_BYTES = 256 * 2**20
_SUFFIX = ".xla"
_ABANDONED = ".abandoned"


@dataclasses.dataclass
class CacheCounts:
    """What the cache did in this process (tests and benchmarks read it)."""

    hits: int = 0
    misses: int = 0
    written: int = 0
    unreadable: int = 0


counts = CacheCounts()
_lock = threading.Lock()


def folder() -> Path | None:
    """Where entries live (None: the cache is off)."""
    configured = os.environ.get(ENV)
    if configured is not None:
        return None if configured.strip().lower() in ("off", "") else Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pallas-check" / "xla"


@functools.cache
def _machine() -> str:
    """This CPU as XLA sees it when compiling for the host: its model and feature flags
    (read once: every segment compile asks)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            lines = [line for line in info if line.startswith(("flags", "model name"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


_PACKAGE = Path(__file__).resolve().parents[2]


@functools.cache
def code_digest() -> str:
    """pallas-check's own code: part of the key of anything kept by what it is rather than
    by its lowered text (the engine's segments, the script's programs before lowering): what
    they lower to depends on the lowerings pallas-check patches."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def key(program_text: str, options: Mapping[str, str | bool] | None) -> str:
    """The entry's name: everything that decides what XLA makes of the program."""
    digest = hashlib.sha256()
    for part in (jax.__version__, jaxlib.__version__, platform.machine(), _machine(),
                 repr(options), program_text):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def compile_cached(lowered: jax.stages.Lowered, device: jax.Device,
                   options: Mapping[str, str | bool] | None = None) -> jax.stages.Compiled:
    """`lowered.compile()`, read from the disk cache when this program was compiled before
    (here or in another process), else compiled and written there. `device`: the one device
    the program runs on (the engine's or JAX's CPU device; an entry is loaded onto it);
    `options`: the compile options the program was lowered with (part of the key)."""
    where = folder()
    if where is None:
        return lowered.compile()
    with program_store.bypassed():  # (kept here, not also among the script's programs)
        return _compile_cached(lowered, device, where, options)


def _compile_cached(lowered: jax.stages.Lowered, device: jax.Device, where: Path,
                    options: Mapping[str, str | bool] | None) -> jax.stages.Compiled:
    # The program's text leaves out what it does not use (an unused argument is dropped),
    # and the executable checks every argument: the signature is part of the key.
    signature = repr((lowered.args_info, lowered.out_info))
    path = where / (key(signature + "\n" + lowered.as_text(), options) + _SUFFIX)
    found = _read(path, device)
    if found is not None:
        return found
    compiled = lowered.compile()
    write_entry(path, compiled)
    return compiled


def compile_to(lowered: jax.stages.Lowered, path: Path) -> jax.stages.Compiled:
    """`lowered.compile()`, kept at `path` (`entry_path`) for the next process."""
    with program_store.bypassed():  # (kept here, not also among the script's programs)
        compiled = lowered.compile()
    write_entry(path, compiled)
    return compiled


def entry_path(program_text: str, options: Mapping[str, str | bool] | None) -> Path | None:
    """Where the executable of `program_text` (its signature included) is kept (None: the
    cache is off)."""
    where = folder()
    return None if where is None else where / (key(program_text, options) + _SUFFIX)


def read_entry(path: Path, device: jax.Device) -> jax.stages.Compiled | None:
    """The executable kept at `path`, loaded onto `device` (None: none there, or torn)."""
    return _read(path, device)


def _read(path: Path, device: jax.Device) -> jax.stages.Compiled | None:
    try:
        data = path.read_bytes()
    except OSError:
        with _lock:
            counts.misses += 1
        return None
    try:
        serialized, in_tree, out_tree = pickle.loads(data)
        compiled: jax.stages.Compiled = serialize_executable.deserialize_and_load(
            serialized, in_tree, out_tree, backend=device.client, execution_devices=[device])
    except Exception:  # noqa: BLE001 - a torn or foreign entry: compiled again
        with _lock:
            counts.unreadable += 1
            counts.misses += 1
        _remove(path)
        return None
    try:
        os.utime(path)  # recently used: the last to go
    except OSError:
        pass
    with _lock:
        counts.hits += 1
    return compiled


def write_entry(path: Path, compiled: jax.stages.Compiled) -> None:
    """`compiled` kept at `path` (atomically: a reader finds it whole or not at all); a
    compile worker (engine/runtime/bounded_compile.py) writes its result so."""
    try:
        data = pickle.dumps(serialize_executable.serialize(compiled))
    except Exception:  # noqa: BLE001 - not serializable (a host callback): not kept
        return
    if _replace(path, data):
        with _lock:
            counts.written += 1
        _prune(path.parent)


def _replace(path: Path, data: bytes) -> bool:
    """`data` written to `path` through a temporary file and a rename (concurrent writers
    of one key each leave a whole file); False when the folder cannot be written."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except OSError:  # (a full disk: no half-written file is left behind)
        if temporary is not None:
            _remove(Path(temporary))
        return False
    return True


class ScriptPrograms:
    """The script's own plain programs' executables (jaxbridge/program_store.py asks it
    by a program's identity or under JAX's key), in the `programs` folder beside ours: written
    atomically, least recently used removed past `_PROGRAMS_LIMIT_BYTES`, keyed also by
    this CPU (JAX's key names the backend, not the host's instruction set)."""

    def __init__(self, where: Path) -> None:
        self.where = where / "programs"
        self._machine = hashlib.sha256(_machine().encode()).hexdigest()[:16]
        self._written = 0

    def _path(self, jax_key: str) -> Path:
        digest = hashlib.sha256(f"{jax_key}\0{self._machine}".encode()).hexdigest()
        return self.where / (digest + _SUFFIX)

    def get(self, jax_key: str) -> bytes | None:
        path = self._path(jax_key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        return data

    def put(self, jax_key: str, data: bytes) -> None:
        if _replace(self._path(jax_key), data):
            self._written += 1
            if self._written % 32 == 1:  # (a suite writes hundreds: listed now and then)
                _prune(self.where, _PROGRAMS_LIMIT_BYTES)

    def discard(self, jax_key: str) -> None:
        _remove(self._path(jax_key))

    def identity_key(self, identity: str) -> str:
        """A program found before lowering (jaxbridge/program_identity.py): `identity`
        with pallas-check's code and, through `key`, JAX's and jaxlib's versions and this
        CPU."""
        return "identity " + key("identity\n" + code_digest() + "\n" + identity, None)


def script_programs() -> ScriptPrograms | None:
    """The store of the script's plain programs (None: the cache is off)."""
    where = folder()
    return None if where is None else ScriptPrograms(where)


def _stamp() -> dict[str, str]:
    """What an abandonment record must match to be trusted (its key holds them too; a
    file that does not say them, torn or written by something else, is not trusted)."""
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "machine": hashlib.sha256(_machine().encode()).hexdigest()[:16]}


def abandon(record: str, reason: str) -> None:
    """Record that the build keyed `record` (`key` of the structure and what decides its
    program) overran its budget, with the reason (nothing when the cache is off)."""
    where = folder()
    if where is not None:
        _replace(where / (record + _ABANDONED),
                 json.dumps({**_stamp(), "reason": reason}).encode())


def abandoned(record: str) -> str | None:
    """Why the build keyed `record` was abandoned by an earlier process (None: it was
    not, the cache is off, or the record is not to be trusted and is removed)."""
    where = folder()
    if where is None:
        return None
    path = where / (record + _ABANDONED)
    try:
        found = json.loads(path.read_bytes())
    except OSError:
        return None
    except ValueError:  # torn: never trusted
        _remove(path)
        return None
    if not isinstance(found, dict) or any(found.get(k) != v for k, v in _stamp().items()) \
            or not isinstance(found.get("reason"), str):
        _remove(path)
        return None
    return str(found["reason"])


def _prune(where: Path, limit: int | None = None) -> None:
    """Remove the least recently used entries while the folder holds over `limit` (the
    engine's limit unless given)."""
    limit = _LIMIT_BYTES if limit is None else limit
    entries = []
    for path in where.glob("*" + _SUFFIX):
        try:
            status = path.stat()
        except OSError:  # (removed meanwhile by another process)
            continue
        entries.append((status.st_mtime, status.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        _remove(path)
        total -= size


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
