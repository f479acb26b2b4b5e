"""A patched lowering of `pallas_call`: every call becomes one host callback to a handler.

While installed, every pallas_call that is lowered (eagerly, under jit, vmap, grad or
shard_map) becomes ONE host callback carrying the call's operands to a handler, which runs
our engine and returns the outputs. The user's own `interpret=` argument is ignored.

A call the compiled tier runs (pallas_check/compiled/) may instead be lowered inline
(`Inline`): its computation traced into the script's own program, followed by one FFI
call taking only its verdict (and the operands, lent), which says whether that run
stands; where it does not, the handler's callback runs the call, in a branch XLA takes
only then. A clean call so costs its computation and that small call, with no operand
or output crossing to Python.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Hashable, Iterator, Sequence, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
from pallas_check.jaxbridge.types import AbstractSemaphoreTy, AbstractValue, Primitive, ShapedArray
from pallas_check.jaxbridge.jaxprs import axis_sizes
from pallas_check.jaxbridge import lowering as jax_lowering
from pallas_check.jaxbridge import keys
from pallas_check.jaxbridge.lowering import LoweringRuleContext
from pallas_check.jaxbridge.primitives import pallas_call_p

from pallas_check.intercept import hostcall
from pallas_check.findings.finding import SourceFrame
from pallas_check.findings.sourceinfo import user_frames

# handler(params, operands, device, mesh_axes) -> outputs. Under shard_map every device's
# callback arrives on its own thread with its logical device id and the named mesh axes
# ((name, size) pairs, row-major); elsewhere device is 0 and mesh_axes is empty. The
# operands are read-only numpy arrays, valid during the call only (on one CPU device they
# are XLA's own buffers): a handler that keeps one copies it. Installed with
# fills_results, a handler also gets `results=` (one CPU device), the buffers its outputs
# are returned in, and may fill them in place and return them. Installed with call_sites, it
# also gets `call_site=`, the SourceFrame of the script's line that made the call (or None).
# (`params`: the pallas_call primitive's, JAX's own values of any kind; its keywords vary
# with the installation, so its signature is open past its use.)
CallHandler = Callable[..., Sequence[np.ndarray]]

# The named mesh axes of a shard_map, (name, size) pairs, row-major.
MeshAxes = tuple[tuple[Hashable, int], ...]


@dataclasses.dataclass(frozen=True)
class Inline:
    """How one call site is lowered inline. `run(*operands)` is traced into the program
    and returns the outputs, the verdict (int32) and what its race check covered;
    `decide(verdict, coverage, *operands)` runs on the host (numpy arrays, the operands
    lent read-only) and returns 0 when the inline run stands (the call is recorded there),
    1 when the handler runs the call instead."""

    run: Callable[..., tuple[Sequence[jax.Array], jax.Array, jax.Array]]
    decide: Callable[..., int]


# inline(params, call_site) -> Inline, or None: the call goes through the handler.
InlineHook = Callable[[dict, SourceFrame | None], Inline | None]

# chip(params, operand avals ((shape, dtype name), ...), mesh_axes, call_site): called as
# each call is lowered, before anything of it is emitted; what it raises is what the
# lowering of the user's program raises (intercept/chip.py: the chip's compile error).
ChipHook = Callable[[dict, tuple[tuple[tuple[int, ...], str], ...], "MeshAxes",
                     SourceFrame | None], None]

# Set on a thread that compiles a call for a real TPU while the interception is installed
# (intercept/chip.py): there every pallas_call gets JAX's own lowering.
_real = threading.local()


@contextlib.contextmanager
def real_lowering() -> Iterator[None]:
    """While active on this thread, pallas_calls lowered here get JAX's own lowering."""
    before = getattr(_real, "on", False)
    _real.on = True
    try:
        yield
    finally:
        _real.on = before

_lock = threading.Lock()

# What a lowering rule returns: per result, its IR value (or values) (JAX's MLIR types,
# reached only through the bridge).
_Lowered = Sequence[object]


@dataclasses.dataclass
class _Saved:
    """What `install` replaced, for `uninstall` to restore, and what it made meanwhile."""

    lowering: jax_lowering.SavedLowering  # JAX's own pallas_call lowering
    targets: list[int] = dataclasses.field(default_factory=list)  # hostcall targets made
    programs: Hashable | None = None  # what JAX's caches are keyed by (`install`)


_saved: _Saved | None = None


# One host callback, emitted straight into the lowered module. `jax.experimental.io_callback`
# would do the same with two more copies of every operand (it puts the arrays XLA hands
# the host back on a device, and the handler then copies them out again): for a kernel
# whose operands are large, those copies were most of the memory a run took.
_host_call_p = Primitive("pallas_check_host_call")
_host_call_p.multiple_results = True
_host_call_p.def_abstract_eval(lambda *args, host, result_avals: result_avals)


def _host_call_lowering(ctx: LoweringRuleContext, *args: Any,
                        host: Callable[..., Sequence[np.ndarray]],
                        result_avals: tuple[ShapedArray, ...]) -> _Lowered:
    """JAX's Python callback running `host`. The handler runs inside JAX's own callback:
    XLA runs computations started from there inline on the calling thread (it marks the
    thread as inside a host callback), which the engine's many small compiled segments
    need -- started from any other handler they go through asynchronous dispatch (1.7x
    slower end to end; devices waiting for each other deadlocked). On one CPU device the
    callback's operands are lent by intercept/hostcall.py instead of copied in."""
    if not jax_lowering.one_cpu_device(ctx):
        return jax_lowering.emit_host_callback(ctx, host, args, ctx.avals_in, ctx.avals_out)
    ticket_aval = ShapedArray((), np.int32)
    outputs = list(ctx.avals_out)
    lend_target = _target(hostcall.lend, ctx.avals_in, [ticket_aval, *outputs])
    give_back_target = _target(hostcall.give_back, [ticket_aval, ticket_aval, *ctx.avals_in,
                               *outputs], outputs, operands_read=2, results_read=0)
    ffi_call = jax_lowering.ffi_lowering(hostcall.TARGET_NAME)
    ticket, *buffers = ffi_call(ctx.replace(avals_out=[ticket_aval, *outputs]), *args,
                                index=np.uint64(lend_target)).results

    def run(ticket_value: np.ndarray) -> list[np.ndarray]:
        operands, results = hostcall.take(int(ticket_value))
        for result, value in zip(results, host(*operands, results=results)):
            if not _same_memory(result, value):
                np.copyto(result, value)
        return [np.zeros((), np.int32)]

    (done,) = jax_lowering.emit_host_callback(
        ctx.replace(avals_in=[ticket_aval], avals_out=[ticket_aval]), run, [ticket],
        [ticket_aval], [ticket_aval])
    # Using the operands again after the callback keeps XLA from reusing their buffers
    # while the callback reads them; the outputs are the buffers it filled (aliased).
    first_buffer = 2 + len(args)
    give_back = jax_lowering.ffi_lowering(hostcall.TARGET_NAME, operand_output_aliases={
        first_buffer + k: k for k in range(len(outputs))})
    return give_back(
        ctx.replace(avals_in=[ticket_aval, ticket_aval, *ctx.avals_in, *outputs]),
        done, ticket, *args, *buffers, index=np.uint64(give_back_target)).results


def _target(host: hostcall.HostFunction, operand_avals: Sequence[object],
            result_avals: Sequence[object], operands_read: int | None = None,
            results_read: int | None = None) -> int:
    """A hostcall target for one call site, dropped when this installation ends."""
    target_id = hostcall.add_target(host, operand_avals, result_avals, operands_read,
                                    results_read)
    with _lock:
        if _saved is not None:
            _saved.targets.append(target_id)
    return target_id


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `b` is `a` (the handler filled the output buffer in place)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype)


# Operands are lent only in a computation of one CPU device (`jax_lowering.one_cpu_device`):
# other platforms have no host buffers to lend; several devices keep JAX's copies.
jax_lowering.register_lowering(_host_call_p, _host_call_lowering)


# Called with every exception a handler raises (the runner keeps those that are our bugs);
# the script itself sees only JAX's runtime error for the failed computation.
_failure_listeners: list[Callable[[BaseException], None]] = []


@contextlib.contextmanager
def handler_failures(listener: Callable[[BaseException], None]) -> Iterator[None]:
    """While active, `listener` hears of every exception raised by an installed handler
    (and of an `InterceptionFailed`, our lowering of a call failing)."""
    with _lock:
        _failure_listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _failure_listeners.remove(listener)


def _host_call(host: Callable[..., Sequence[np.ndarray]],
               result_shapes: Sequence[jax.ShapeDtypeStruct], *args: jax.Array) -> list[jax.Array]:
    """Call `host` on the host with `args` as (read-only) numpy arrays; it returns numpy
    arrays of `result_shapes`."""
    avals = tuple(ShapedArray(s.shape, s.dtype) for s in result_shapes)
    return _host_call_p.bind(*args, host=_reporting(host), result_avals=avals)


_Host = TypeVar("_Host", bound=Callable[..., Any])


def _reporting(host: _Host) -> _Host:
    """`host`, telling the failure listeners of what it raises."""
    def reporting_host(*arrays: np.ndarray, **kwargs: object) -> Any:
        try:
            return host(*arrays, **kwargs)
        except BaseException as exc:
            _tell_listeners(exc)
            raise

    return cast(_Host, reporting_host)


def _device_index(axes: MeshAxes) -> jax.Array:
    """This device's index in the shard_map mesh (row-major over `axes`), 0 outside one."""
    device = jnp.int32(0)
    for name, size in axes:
        device = device * size + jax.lax.axis_index(name)
    return device


def _mesh_axes() -> MeshAxes:
    return tuple((name, int(size))
                 for name, size in axis_sizes().items())


def _make_lowering(handler: CallHandler, fills_results: bool, call_sites: bool,
                   inline: InlineHook | None = None, chip: ChipHook | None = None
                   ) -> Callable[..., _Lowered]:
    def lowering(ctx: LoweringRuleContext, *in_nodes: Any, **params: Any) -> _Lowered:
        if getattr(_real, "on", False) and _saved is not None:  # compiling for a TPU
            return cast(_Lowered, _saved.lowering.module_lowering(ctx, *in_nodes, **params))
        params.pop("interpret", None)
        jax_lowering.note_kernel_module(ctx)  # (its executable dies with the interception)
        frames = _user_frames_of(ctx.traceback)  # the innermost frame of the user's code
        call_site = frames[0] if frames else None
        if chip is not None and (avals := _operand_avals(ctx.avals_in)) is not None:
            chip(params, avals, _mesh_axes(), call_site)  # its refusal is the program's
        try:
            return _ours(ctx, in_nodes, params, call_site)
        except Exception as exc:  # our failure, not the user's: exit 4 (run/runner.py)
            raise interception_failed(exc) from exc

    def _ours(outer: LoweringRuleContext, in_nodes: Any, params: Any,
              call_site: SourceFrame | None) -> _Lowered:
        """The call lowered to our handler (or inline): anything it raises is our bug.
        Semaphore and key operands and results travel as XLA holds them (`_physical`)."""
        ctx = outer.replace(avals_in=[_physical(a) for a in outer.avals_in],
                            avals_out=[_physical(a) for a in outer.avals_out])
        result_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]
        # Inline only where the operands can be lent to `decide` (one CPU device).
        plan = (inline(params, call_site)
                if inline is not None and jax_lowering.one_cpu_device(ctx) else None)

        def impl(*args: jax.Array) -> list[jax.Array]:
            axes = _mesh_axes()

            def host(device_id: np.ndarray, *operands: np.ndarray,
                     results: list[np.ndarray] | None = None) -> list[np.ndarray]:
                extra: dict[str, object] = {"call_site": call_site} if call_sites else {}
                if fills_results and results is not None:
                    extra["results"] = results
                outs = handler(params, list(operands), int(device_id), axes, **extra)
                return [np.asarray(keys.to_physical(np.asarray(o)), dtype=s.dtype).reshape(s.shape)
                        for o, s in zip(outs, result_shapes)]

            def handled() -> list[jax.Array]:
                return _host_call(host, result_shapes, _device_index(axes), *args)

            if plan is None or axes:
                return handled()
            return _inlined(plan, result_shapes, handled, args)

        lowered = jax_lowering.lower_fun(impl, ctx, *in_nodes)
        if ctx.tokens_out is not None:  # effects of the call (set on the context given)
            outer.set_tokens_out(ctx.tokens_out)
        return lowered

    return lowering


class InterceptionFailed(Exception):
    """Our lowering of an intercepted call failed: our bug (exit 4), not the script's."""


def interception_failed(exc: Exception) -> InterceptionFailed:
    """`exc`, raised by our lowering of a call, as ours: the failure listeners hear of it."""
    failed = InterceptionFailed(
        f"internal error while intercepting a pallas_call: {type(exc).__name__}: {exc}")
    _tell_listeners(failed)
    return failed


def _tell_listeners(exc: BaseException) -> None:
    with _lock:
        listeners = list(_failure_listeners)
    for listener in listeners:
        listener(exc)


def _inlined(plan: Inline, result_shapes: Sequence[jax.ShapeDtypeStruct],
             handled: Callable[[], list[jax.Array]], args: Sequence[jax.Array]
             ) -> list[jax.Array]:
    """The call's computation in the program; its outputs stand unless `decide` says
    the handler runs the call (a branch taken only then)."""
    outputs, verdict, coverage = plan.run(*args)
    ran = [jnp.asarray(o).astype(s.dtype).reshape(s.shape)
           for o, s in zip(outputs, result_shapes)]
    to_handler = _decide_p.bind(verdict, coverage, *args, decide=_reporting(plan.decide))
    return list(jax.lax.cond(to_handler != 0, handled, lambda: ran))


# The verdict of a call run inline, read on the host by one XLA FFI call
# (intercept/hostcall.py): a ctypes call with the operands lent (measured: 35-50 us over
# a program without it, where JAX's Python callback of one scalar costs 70-120 us).
_decide_p = Primitive("pallas_check_inline_verdict")
_decide_p.def_abstract_eval(lambda *args, decide: ShapedArray((), np.int32))


def _decide_lowering(ctx: LoweringRuleContext, *args: Any,
                     decide: Callable[..., int]) -> _Lowered:
    def target(operands: Sequence[np.ndarray], results: Sequence[np.ndarray]) -> None:
        results[0][...] = decide(*operands)

    target_id = _target(target, ctx.avals_in, ctx.avals_out)
    ffi_call = jax_lowering.ffi_lowering(hostcall.TARGET_NAME)
    return cast(_Lowered, ffi_call(ctx, *args, index=np.uint64(target_id)).results)


jax_lowering.register_lowering(_decide_p, _decide_lowering)


def _operand_avals(avals: Sequence[AbstractValue]
                   ) -> tuple[tuple[tuple[int, ...], str], ...] | None:
    """The operands as (shape, dtype name) pairs, as the chip compiles them; None when one
    is not a plain array (a semaphore or key passed between calls: not compiled alone)."""
    pairs = []
    for aval in avals:
        raw = getattr(aval, "dtype", None)
        try:
            dtype = np.dtype(raw) if raw is not None else None
        except TypeError:
            dtype = None
        if dtype is None:
            return None
        pairs.append((tuple(int(d) for d in cast(ShapedArray, aval).shape), str(dtype)))
    return tuple(pairs)


def _physical(aval: AbstractValue) -> AbstractValue:
    """A semaphore-typed aval as the int32 array XLA represents it by (the handler puts a
    handle to its value in it, engine/call/carried.py), a key-typed one as its uint32
    words (jaxbridge/keys.py); others unchanged."""
    dtype = getattr(aval, "dtype", None)
    if isinstance(dtype, AbstractSemaphoreTy):
        return ShapedArray(cast(ShapedArray, aval).shape, np.int32)
    return keys.physical_aval(aval)


def _user_frames_of(traceback: object) -> tuple[SourceFrame, ...]:
    class _Info:  # user_frames reads a source_info's traceback
        pass

    info = _Info()
    info.traceback = traceback  # type: ignore[attr-defined]
    try:
        return user_frames(info, limit=1)
    except Exception:  # noqa: BLE001 - a missing call site is no reason to fail the call
        return ()


# What the hardware lowering is given as `interpret=`: False (Mosaic on a TPU, Triton or
# Mosaic GPU on a GPU). Tests set it to True to run the native modes' plumbing on a CPU,
# with JAX's HLO interpreter standing in for the hardware.
NATIVE_INTERPRET: bool = False


def _make_native_lowering(handler: Callable[..., Sequence[np.ndarray]], mode: str,
                          original: Any) -> Callable[..., _Lowered]:  # (JAX's rule entry)
    """The hardware lowering of the call, in the same executable, plus one host callback.

    mode "alongside": the callback gets the operands and the hardware's outputs,
    handler(params, operands, device, mesh_axes, native_outputs), and what it returns is
    what the script gets. mode "observe": the hardware's outputs are what the script gets;
    the callback only shows the operands to handler(params, operands, device, mesh_axes).
    The hardware kernel is never run from inside a callback (re-entering a busy
    accelerator from its own host callback can deadlock).
    """

    def lowering(ctx: LoweringRuleContext, *in_nodes: Any, **params: Any) -> _Lowered:
        params.pop("interpret", None)
        jax_lowering.note_kernel_module(ctx)
        native = jax_lowering.hardware_nodes(original.rule, ctx, in_nodes, params,
                                             NATIVE_INTERPRET)
        result_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]
        n_in = len(in_nodes)

        def impl(*args: jax.Array) -> list[jax.Array]:
            operands, outs = args[:n_in], list(args[n_in:])
            axes = _mesh_axes()
            device = _device_index(axes)
            if mode == "observe":
                def observe(device_id: np.ndarray, *arrays: np.ndarray,
                            results: list[np.ndarray] | None = None) -> tuple[()]:
                    handler(params, list(arrays), int(device_id), axes)
                    return ()

                _host_call(observe, (), device, *operands)
                return outs

            def host(device_id: np.ndarray, *arrays: np.ndarray,
                     results: list[np.ndarray] | None = None) -> list[np.ndarray]:
                values = list(arrays)
                res = handler(params, values[:n_in], int(device_id), axes, values[n_in:])
                return [np.asarray(o, dtype=s.dtype).reshape(s.shape)
                        for o, s in zip(res, result_shapes)]

            return _host_call(host, result_shapes, device, *operands, *outs)

        sub = ctx.replace(avals_in=[*ctx.avals_in, *ctx.avals_out], tokens_out=None)
        lowered = jax_lowering.lower_fun(impl, sub, *in_nodes, *native)
        if sub.tokens_out is not None:
            ctx.set_tokens_out(sub.tokens_out)
        return lowered

    return lowering


def native_function(params: dict[str, Any]) -> jax.stages.Wrapped:
    """A jitted function running one pallas_call (its primitive's params, without
    `interpret`) through the hardware lowering; use it with no interception installed."""
    prim = pallas_call_p
    params = {k: v for k, v in params.items() if k != "interpret"}
    return jax.jit(lambda *args: prim.bind(*args, interpret=NATIVE_INTERPRET, **params))


def install(handler: CallHandler, mode: str = "replace", fills_results: bool = False,
            call_sites: bool = False, inline: InlineHook | None = None,
            chip: ChipHook | None = None, programs: Hashable | None = None) -> None:
    """Route every pallas_call lowered from now on to `handler` (one callback per call).

    mode "replace" (pallas-check run): the handler's outputs replace the call's; "alongside"
    and "observe" keep the hardware lowering too (see `_make_native_lowering`).
    fills_results / call_sites (replace mode): the handler also takes `results=` /
    `call_site=` (see CallHandler); `inline` (replace mode): which call sites are lowered
    inline (see `Inline`); `chip` (replace mode): asked of each call as it is lowered (see
    `ChipHook`). `programs` (what lowered programs depend on, with intercept/outer.py's
    hook on): JAX's caches keyed by it, not emptied (jaxbridge/lowering.py)."""
    global _saved

    with _lock:
        if _saved is not None:
            raise RuntimeError("pallas-check interception is already installed")
        if mode not in ("replace", "alongside", "observe"):
            raise ValueError(f"unknown interception mode {mode!r}")
        if mode != "replace" and not jax_lowering.pallas_call_lowering_is_plain():
            raise RuntimeError("this JAX's pallas_call lowering is not the one pallas-check"
                               " knows how to wrap")
        rule = (_make_lowering(handler, fills_results, call_sites, inline, chip)
                if mode == "replace"
                else _make_native_lowering(handler, mode,
                                           jax_lowering.pallas_call_lowering()))
        # (`pl.kernel` kernels: via pallas_call.py's lowering function, on a TPU mpmd_map's)
        native = mode != "replace"
        _saved = _Saved(jax_lowering.patch_pallas_call_lowering(rule, native), programs=programs)
    jax_lowering.begin_programs(programs)  # what JAX compiled before used the real lowering


def installed() -> bool:
    """Whether pallas_calls are being routed to a handler now (a run, a test, a block)."""
    return _saved is not None


def uninstall() -> None:
    """Restore JAX's own pallas_call lowering."""
    global _saved
    with _lock:
        if _saved is None:
            return
        jax_lowering.restore_pallas_call_lowering(_saved.lowering)
        hostcall.drop_targets(_saved.targets)
        programs, _saved = _saved.programs, None
    jax_lowering.end_programs(programs)


@contextlib.contextmanager
def intercepted(handler: CallHandler, mode: str = "replace", fills_results: bool = False,
                call_sites: bool = False, inline: InlineHook | None = None,
                chip: ChipHook | None = None, programs: Hashable = None) -> Iterator[None]:
    install(handler, mode, fills_results, call_sites, inline, chip, programs)
    try:
        yield
    finally:
        uninstall()
