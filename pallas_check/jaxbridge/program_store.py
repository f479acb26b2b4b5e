"""The script's own programs, compiled once across processes: a hook on JAX's compile.

Why: a kernel repository's test suite compiles hundreds of small plain programs (each
`jnp` operation on each test's shapes, `jax.random` draws, the references), 30 of a warm
suite's 48 s (benchmarks/README.md, issue 55), and compiles the same ones again in every
run, every xdist worker, every pre-commit hook. JAX has a persistent compilation cache for
this, but off by default for programs that compile in under a second, its file store
writes entries in place (an xdist worker may read one half-written) and is bounded only
with a package we do not ship. So, while installed, JAX's compile of a program for the CPU
asks a store of ours first, under JAX's own key for it (`compilation_cache.get_cache_key`:
the module, the devices, the compile options, the backend's and JAX's versions), and keeps
what it compiled there (engine/runtime/disk_cache.py `ScriptPrograms`: atomic, bounded,
keyed also by this CPU). JAX's configuration is not touched: a script that set up JAX's
persistent cache (`jax_compilation_cache_dir`) keeps it, and the store stays out of its way.

Never stored: a program that calls back into Python (JAX does not store those either), one
the patched pallas_call lowering lowered a kernel into (it calls this process's
interception: jaxbridge/lowering.py `note_kernel_module`), one compiled for anything but the
host CPU (the chip's compile, tpu_compile/), and pallas-check's own programs, which have
their own cache (compiled inside `bypassed()`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Iterator, Protocol, cast

from jax._src import compilation_cache as _compilation_cache
from jax._src import compiler as _compiler

from pallas_check.jaxbridge import lowering as _lowering


class Store(Protocol):
    def get(self, key: str) -> bytes | None:
        """The serialized executable kept under `key` (None: none, or unreadable)."""

    def put(self, key: str, data: bytes) -> None:
        """Keep `data` under `key` (quietly nothing where it cannot be written)."""

    def discard(self, key: str) -> None:
        """`key`'s entry could not be loaded: never offered again."""


@dataclasses.dataclass
class StoreCounts:
    """What the hook did in this process (tests and benchmarks read it)."""

    hits: int = 0
    misses: int = 0
    skipped: int = 0


counts = StoreCounts()
_store: Store | None = None
_original: Callable[..., object] | None = None
_lock = threading.Lock()
_local = threading.local()


def install(store: Store) -> None:
    """JAX's compiles for the CPU go through `store` from now on (once per process is
    enough; installing again changes the store)."""
    global _store, _original
    with _lock:
        if _original is None:
            _original = _compiler.compile_or_get_cached
            _compiler.compile_or_get_cached = _compile_or_get_stored
        _store = store


def uninstall() -> None:
    """JAX's own compile again."""
    global _store, _original
    with _lock:
        if _original is not None:
            _compiler.compile_or_get_cached = _original
        _store, _original = None, None


def installed() -> bool:
    return _store is not None


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Compiles on this thread meanwhile are JAX's own (pallas-check's programs, which
    engine/runtime/disk_cache.py keeps itself)."""
    depth = getattr(_local, "bypass", 0)
    _local.bypass = depth + 1
    try:
        yield
    finally:
        _local.bypass = depth


class _Client(Protocol):
    platform: str

    def deserialize_executable(self, data: bytes, devices: object, options: object
                               ) -> object: ...

    def serialize_executable(self, executable: object) -> bytes: ...


def _compile_or_get_stored(backend: _Client, computation: object, devices: object,
                           compile_options: object, host_callbacks: object,
                           executable_devices: object, *rest: object, **kwargs: object
                           ) -> object:
    original, store = cast(Callable[..., object], _original), _store
    args = (backend, computation, devices, compile_options, host_callbacks, executable_devices,
            *rest)
    if (store is None or _lowering.kernel_module(computation) or host_callbacks
            or getattr(_local, "bypass", 0) or getattr(backend, "platform", None) != "cpu"
            or _compilation_cache.is_persistent_cache_enabled()):  # (the script's own)
        with _lock:
            counts.skipped += 1
        return original(*args, **kwargs)
    try:
        keyed = getattr(_compilation_cache, "get_cache_key")  # (JAX's key for its own cache)
        key = str(keyed(computation, devices, compile_options, backend))
    except Exception:  # noqa: BLE001 - JAX cannot key it: compiled as JAX would
        with _lock:
            counts.skipped += 1
        return original(*args, **kwargs)
    data = store.get(key)
    if data is not None:
        try:
            loaded = backend.deserialize_executable(data, executable_devices, compile_options)
        except Exception:  # noqa: BLE001 - a foreign or torn entry: compiled again
            store.discard(key)
        else:
            with _lock:
                counts.hits += 1
            return loaded
    executable = original(*args, **kwargs)
    with _lock:
        counts.misses += 1
    try:
        serialize = getattr(executable, "serialize", None)
        data = serialize() if serialize is not None else backend.serialize_executable(executable)
    except Exception:  # noqa: BLE001 - not serializable: not kept
        return executable
    store.put(key, data)
    return executable
