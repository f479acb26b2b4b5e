"""Zero-copy operands for the host callback: an XLA FFI handler lends Python XLA's buffers.

JAX's Python callback copies every operand into a fresh numpy array before the callback
runs; for a kernel over large arrays those copies are most of a checked run's memory.
Here one XLA FFI handler, written with ctypes against XLA's stable C API
(`xla/ffi/api/c_api.h`), wraps a custom call's operand and result buffers as numpy
arrays in place. intercept/patched_lowering.py brackets JAX's Python callback with two such calls: `lend`
(sees the operands, files read-only views of them under a ticket it returns) and
`give_back` (uses the operands again after the callback, so that XLA keeps them alive
while the callback reads them). The engine itself still runs inside JAX's own callback:
computations it starts from there run inline, which they would not from this handler.

Only the CPU runtime gives a handler host memory.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
import traceback
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

# -- the C API's structs (c_api.h, XLA_FFI_API_MAJOR 0, XLA_FFI_API_MINOR 3) -------------

_API_MAJOR, _API_MINOR = 0, 3
_EXTENSION_METADATA = 1
_STAGE_EXECUTE = 3
_ERROR_INTERNAL = 13


class _ExtensionBase(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion),
                ("traits", ctypes.c_uint32), ("state_type_id", ctypes.c_int64)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _ExtensionBase),
                ("metadata", ctypes.POINTER(_Metadata))]


class _Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("dtype", ctypes.c_int), ("data", ctypes.c_void_p), ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


class _Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                ("args", ctypes.POINTER(ctypes.POINTER(_Buffer)))]


class _Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                ("names", ctypes.c_void_p), ("attrs", ctypes.POINTER(ctypes.c_void_p))]


class _Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.c_void_p)]


class _CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("api", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int),
                ("args", _Args), ("rets", _Args), ("attrs", _Attrs),
                ("future", ctypes.c_void_p)]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


_ERROR_CREATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorCreateArgs))


class _ApiHead(ctypes.Structure):
    """The start of XLA_FFI_Api, up to its first function: XLA_FFI_Error_Create."""

    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("api_version", _ApiVersion), ("internal_api", ctypes.c_void_p),
                ("error_create", _ERROR_CREATE)]


def _struct_size(struct: type[ctypes.Structure], last_field: str) -> int:
    """XLA_FFI_STRUCT_SIZE: the offset of the last field plus its size (no padding)."""
    field = getattr(struct, last_field)
    return int(field.offset + field.size)


_HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_CallFrame))

# -- the Python side -----------------------------------------------------------------

# A target: target(operands, results) fills `results` (writable numpy views of the custom
# call's result buffers) from `operands` (read-only views of its operands).
HostFunction = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]


@runtime_checkable
class Shaped(Protocol):
    """What the layout of a call's operand or result is read from: JAX's abstract value
    (`ShapedArray`) or a `jax.ShapeDtypeStruct`."""

    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def dtype(self) -> np.dtype: ...


class _Target:
    """What one lowered call site calls, and the layouts of the buffers it reads (worked
    out once here, not at every call: a call passed through unchecked by --calls costs
    little more than this callback)."""

    __slots__ = ("host", "operand_layouts", "result_layouts")

    def __init__(self, host: HostFunction, operand_avals: Sequence[object],
                 result_avals: Sequence[object]) -> None:
        self.host = host
        self.operand_layouts = tuple(_layout(a) for a in operand_avals)
        self.result_layouts = tuple(_layout(a) for a in result_avals)


def _layout(aval: object) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, bytes) of a buffer of `aval` (JAX types a lowering's avals as any
    abstract value; an array operand's has a shape and a dtype)."""
    if not isinstance(aval, Shaped):
        raise TypeError(f"pallas-check host call: an operand without a shape: {aval!r}")
    dtype = np.dtype(aval.dtype)
    shape = tuple(int(d) for d in aval.shape)
    return dtype, shape, math.prod(shape) * dtype.itemsize


_targets: dict[int, _Target] = {}
_ids = itertools.count(1)
_lock = threading.Lock()
TARGET_NAME = "pallas_check_host_call"


def _view(buffer: _Buffer, layout: tuple[np.dtype, tuple[int, ...], int],
          writable: bool) -> np.ndarray:
    dtype, shape, nbytes = layout
    if nbytes == 0 or not buffer.data:
        array = np.zeros(shape, dtype)
    else:
        raw = (ctypes.c_char * nbytes).from_address(buffer.data)
        array = np.frombuffer(memoryview(raw), dtype=dtype).reshape(shape)  # no copy
    array.flags.writeable = writable
    return array


def _error(frame: _CallFrame, message: str) -> int:
    api = ctypes.cast(frame.api, ctypes.POINTER(_ApiHead)).contents
    args = _ErrorCreateArgs(_struct_size(_ErrorCreateArgs, "errc"), None,
                            message.encode("utf-8", "replace"), _ERROR_INTERNAL)
    return api.error_create(ctypes.byref(args)) or 0


def _handle(frame_ptr: ctypes._Pointer[_CallFrame]) -> int:
    """XLA_FFI_Handler: answer the metadata query, ignore early stages, run the target."""
    try:
        frame = frame_ptr.contents
        if frame.extension_start:
            ext = ctypes.cast(frame.extension_start, ctypes.POINTER(_ExtensionBase)).contents
            if ext.type == _EXTENSION_METADATA:
                meta = ctypes.cast(frame.extension_start,
                                   ctypes.POINTER(_MetadataExtension)).contents.metadata.contents
                meta.api_version.major_version = _API_MAJOR
                meta.api_version.minor_version = _API_MINOR
                meta.traits = 0
                return 0
        if frame.stage != _STAGE_EXECUTE:
            return 0
    except BaseException:  # noqa: BLE001  (nothing may unwind into XLA)
        return 0
    try:
        scalar = ctypes.cast(frame.attrs.attrs[0], ctypes.POINTER(_Scalar)).contents
        target_id = ctypes.cast(scalar.value, ctypes.POINTER(ctypes.c_uint64)).contents.value
        with _lock:
            target = _targets.get(int(target_id))
        if target is None:
            return _error(frame, "pallas-check: this call was lowered by a pallas-check"
                                 " session that has ended")
        args, rets = frame.args.args, frame.rets.args
        operands = [_view(args[i].contents, layout, False)
                    for i, layout in enumerate(target.operand_layouts)]
        results = [_view(rets[i].contents, layout, True)
                   for i, layout in enumerate(target.result_layouts)]
        target.host(operands, results)
        return 0
    except BaseException as exc:  # noqa: BLE001  (reported to XLA as the call's error)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return _error(frame, f"pallas-check host call failed: {detail}")


_handler = _HANDLER(_handle)  # kept alive for the life of the process
_registered = False


def _register() -> None:
    global _registered
    with _lock:
        if _registered:
            return
        import jax.ffi

        pointer = ctypes.cast(_handler, ctypes.c_void_p)
        capsule = jax.ffi.pycapsule(pointer)  # type: ignore[no-untyped-call]  # JAX's: unannotated
        jax.ffi.register_ffi_target(TARGET_NAME, capsule, platform="cpu")
        _registered = True


def add_target(host: HostFunction, operand_avals: Sequence[object],
               result_avals: Sequence[object], operands_read: int | None = None,
               results_read: int | None = None) -> int:
    """Register a host function for one call site; returns the id the lowering embeds.
    `operands_read` / `results_read`: how many leading operands / results the host
    reads (default all): only those are viewed at each call."""
    _register()
    with _lock:
        target_id = next(_ids)
        _targets[target_id] = _Target(host, list(operand_avals)[:operands_read],
                                      list(result_avals)[:results_read])
    return target_id


# ticket -> (the operands, the result buffers), between `lend` and the callback's `take`.
_lent: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
_tickets = itertools.count(1)


def lend(operands: Sequence[np.ndarray], results: Sequence[np.ndarray]) -> None:
    """Target of the `lend` call: file the operands (read-only views of XLA's buffers)
    and the buffers the call's outputs will be returned in (`results[1:]`, writable),
    and write the ticket that names them into `results[0]`."""
    with _lock:
        ticket = next(_tickets) % (2**31 - 1) or 1
        _lent[ticket] = (list(operands), list(results[1:]))
    results[0][...] = ticket


def take(ticket: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The operands and output buffers filed under `ticket` (once): valid until the
    `give_back` call runs; what is written to the output buffers is the call's result."""
    with _lock:
        return _lent.pop(ticket)


def give_back(operands: Sequence[np.ndarray], results: Sequence[np.ndarray]) -> None:
    """Target of the `give_back` call (its operands: the callback's done flag, the ticket,
    the lent operands and output buffers, of which only the first two are viewed; its
    results: those output buffers, aliased): forget the ticket if the callback never
    took it."""
    with _lock:
        _lent.pop(int(operands[1]), None)


def drop_targets(ids: Sequence[int]) -> None:
    """Forget call sites (their session ended); a later call through one is an error."""
    with _lock:
        for target_id in ids:
            _targets.pop(target_id, None)
