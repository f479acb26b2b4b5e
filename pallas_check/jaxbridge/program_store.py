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

Before lowering. Keyed by the lowered module, a warm run still lowered every plain program
to find its key (a third of a warm suite run). So, while installed, a program JAX's dispatch
(`_pjit_call_impl_python`, which lowers, compiles and runs a jitted call that missed JAX's
C++ cache) is about to lower is first keyed by what it is (jaxbridge/program_identity.py:
its jaxpr in full, its operands, JAX's settings, the device); on a hit the dispatch gets the
executable read back with no lowering at all (`_Found`); on a miss it is lowered as JAX
does, compiled, and kept under that key -- as the pickled loaded executable JAX's
`jax.experimental.serialize_executable` makes, with the device and shardings it was
compiled for -- unless JAX's lowering turned out other than the key foresaw (another
device, hoisted constants, a callback: `_as_foreseen`). Such a miss is compiled afresh, not
read back under JAX's key: XLA:CPU cannot serialize an executable it deserialized. What the
key refuses is lowered, and kept under JAX's key as before. The dispatch is told apart from
`jit(f).lower()` (the same lowering function, whose result the script compiles itself) by
its caller: only JAX's dispatch function is answered so; an AOT lowering, a lowering for
other platforms and anything with a profile-guided profiler stay JAX's. Executables found
or kept are also remembered in this process by key (`_MEMORY` of them), so that a dispatch
of the same program again reads nothing.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import sys
import threading
from typing import Callable, Iterator, Protocol, cast

import jax
from jax.experimental import serialize_executable

from jax._src import compilation_cache as _compilation_cache
from jax._src import compiler as _compiler
from jax._src import pjit as _pjit
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import pxla as _pxla

from pallas_check.jaxbridge import lowering as _lowering
from pallas_check.jaxbridge import program_identity


class Store(Protocol):
    def get(self, key: str) -> bytes | None:
        """The serialized executable kept under `key` (None: none, or unreadable)."""

    def put(self, key: str, data: bytes) -> None:
        """Keep `data` under `key` (quietly nothing where it cannot be written)."""

    def discard(self, key: str) -> None:
        """`key`'s entry could not be loaded: never offered again."""

    def identity_key(self, identity: str) -> str:
        """The key of a program found by what it is (program_identity.py), before lowering:
        `identity` with what it does not say (pallas-check's code, JAX's and jaxlib's
        versions)."""


@dataclasses.dataclass
class StoreCounts:
    """What the hook did in this process (tests and benchmarks read it)."""

    hits: int = 0
    misses: int = 0
    skipped: int = 0
    # Before lowering: found (no lowering), lowered and kept, refused a key (lowered as
    # JAX does; why, counted), lowered but not kept (not what the key foresaw).
    identity_hits: int = 0
    identity_misses: int = 0
    identity_refused: int = 0
    identity_unkept: int = 0
    refusals: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


counts = StoreCounts()
_store: Store | None = None
_original: Callable[..., object] | None = None
_original_lower: Callable[..., object] | None = None
_lock = threading.Lock()
_local = threading.local()


def install(store: Store) -> None:
    """JAX's compiles for the CPU go through `store` from now on (once per process is
    enough; installing again changes the store)."""
    global _store, _original, _original_lower
    with _lock:
        if _original is None:
            _original = _compiler.compile_or_get_cached
            _compiler.compile_or_get_cached = _compile_or_get_stored
        if _original_lower is None:
            _original_lower = _pjit._resolve_and_lower
            _pjit._resolve_and_lower = _lower_or_find  # type: ignore[assignment]
        _store = store


def uninstall() -> None:
    """JAX's own compile and lowering again."""
    global _store, _original, _original_lower
    with _lock:
        if _original is not None:
            _compiler.compile_or_get_cached = _original
        if _original_lower is not None and _pjit._resolve_and_lower is _lower_or_find:
            _pjit._resolve_and_lower = _original_lower  # type: ignore[assignment]
        _store, _original, _original_lower = None, None, None
        _found.clear()


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


# -- before lowering: a plain program found by what it is ----------------------------------

# JAX's dispatch function: the one caller of the lowering answered without lowering.
_DISPATCH = ("_pjit_call_impl_python", _pjit._resolve_and_lower.__code__.co_filename)
# (`jit(f).lower(...)` passes the same; a constant hoisted as an argument is refused.)
_PLAIN_LOWERING = _mlir.LoweringParameters(hoist_constants_as_args=False)
_MEMORY = 512  # executables found or kept this process, by key (the dispatch asks again)
_Executable = _pxla.MeshExecutable
_found: "collections.OrderedDict[str, _Executable]" = collections.OrderedDict()
_NO_ARGS: tuple[tuple[()], dict[str, object]] = ((), {})
_NO_RESULTS = jax.tree_util.tree_structure(())


class _Found:
    """What JAX's dispatch gets in place of a lowering on a hit: `compile()` is the
    executable read back; no constant is passed as an argument (a program lowered with
    hoisted constants is refused a key)."""

    def __init__(self, executable: _Executable) -> None:
        self.executable = executable
        self.const_args: list[object] = []

    def compile(self, compiler_options: object = None, *,
                device_assignment: object = None) -> _Executable:
        if compiler_options is not None or device_assignment is not None:
            raise TypeError("a program found before lowering compiles only as dispatched")
        return self.executable


def _from_dispatch() -> bool:
    """Whether JAX's dispatch called the lowering (two frames up: through `_lower_or_find`)."""
    code = sys._getframe(2).f_code
    return (code.co_name, code.co_filename) == _DISPATCH


def _lower_or_find(*positional: object, **params: object) -> object:
    original, store = cast(Callable[..., object], _original_lower), _store
    if (store is None or len(positional) != 1 or not _from_dispatch()
            or not isinstance(positional[0], (list, tuple))
            or bool(getattr(_local, "bypass", 0))
            or params.get("lowering_platforms") is not None
            or params.get("pgle_profiler") is not None
            or params.get("lowering_parameters") != _PLAIN_LOWERING
            or _compilation_cache.is_persistent_cache_enabled()):
        return original(*positional, **params)
    jit_params = {k: v for k, v in params.items()
                  if k not in ("lowering_platforms", "lowering_parameters", "pgle_profiler")}
    identity = program_identity.dispatch_identity(positional[0], jit_params)
    if isinstance(identity, str):
        with _lock:
            counts.identity_refused += 1
            counts.refusals[identity[:80]] += 1
        return original(*positional, **params)
    key = store.identity_key(identity.text)
    executable = _recall(key)
    if executable is None:
        data = store.get(key)
        executable = None if data is None else _load(data, identity.device)
        if data is not None and executable is None:
            store.discard(key)
    if executable is not None:
        _remember(key, executable)
        with _lock:
            counts.identity_hits += 1
        return _Found(executable)
    computation = original(*positional, **params)
    if not isinstance(computation, _pxla.MeshComputation):
        return computation
    # Compiled here, not read back under JAX's key: XLA:CPU cannot serialize again an
    # executable it deserialized (jaxlib 0.10.2: the copy lacks its runtime functions,
    # "Function wrapped_exponential not found"). Kept on `computation`: the dispatch's
    # own compile right after returns it.
    with bypassed():
        executable = computation.compile()
    if not _as_foreseen(computation, identity.device):
        with _lock:
            counts.identity_unkept += 1
        return computation
    with _lock:
        counts.identity_misses += 1
    _remember(key, executable)
    data = _serialize(executable)
    if data is not None:
        store.put(key, data)
    return computation


def _recall(key: str) -> _Executable | None:
    with _lock:
        found = _found.get(key)
        if found is not None:
            _found.move_to_end(key)
        return found


def _remember(key: str, executable: _Executable) -> None:
    with _lock:
        _found[key] = executable
        _found.move_to_end(key)
        while len(_found) > _MEMORY:
            _found.popitem(last=False)


def _as_foreseen(computation: object, device: jax.Device) -> bool:
    """Whether JAX lowered what the key foresaw: a module for that one device, no constant
    passed as an argument, no callback, no effect, no kernel (else not kept)."""
    if not isinstance(computation, _pxla.MeshComputation):
        return False
    devices = computation._device_list
    compile_args = computation.compile_args
    return (devices is not None and tuple(devices) == (device,)
            and not computation.const_args
            and not compile_args.get("host_callbacks")
            and not compile_args.get("ordered_effects")
            and not compile_args.get("unordered_effects")
            and compile_args.get("pgle_profiler") is None
            and not _lowering.kernel_module(computation.stablehlo()))


def _serialize(executable: _Executable) -> bytes | None:
    """The loaded executable as JAX's `serialize_executable` pickles it (None: it cannot)."""
    try:
        compiled = jax.stages.Compiled(executable, [], _NO_ARGS, _NO_RESULTS)
        data, _, _ = serialize_executable.serialize(compiled)
    except Exception:  # noqa: BLE001 - not serializable: not kept
        return None
    return bytes(data)


def _load(data: bytes, device: jax.Device) -> _Executable | None:
    """An entry loaded onto `device` (None: torn, or not an executable JAX's dispatch runs)."""
    try:
        compiled = serialize_executable.deserialize_and_load(
            data, jax.tree_util.tree_structure(_NO_ARGS), _NO_RESULTS,
            backend=device.client, execution_devices=[device])
        executable = compiled._executable
    except Exception:  # noqa: BLE001 - a torn or foreign entry: lowered again
        return None
    return executable if isinstance(executable, _pxla.MeshExecutable) else None
