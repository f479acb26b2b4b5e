"""The jitted call around the kernels: a hook on JAX's dispatch of a top-level call.

A `pallas_call` inside `jax.jit` runs as one host callback of the jitted computation
(intercept/patched_lowering.py): the callback alone cannot tell what the program keeps of a call's outputs.
Every top-level dispatch of a jitted computation -- `jax.jit(f)(x)` from Python, and an
eager primitive such as an eager `pallas_call`, which JAX runs as a jitted computation of
its own -- goes through one function of JAX's (`_pjit_call_impl_python`: lower, compile,
run). While installed, a computation that holds a pallas_call is run there between
`Listener.opened` and `Listener.closed`: closed gets its results and a way to run the
same executable on the same arguments again (pallas_check/intercept/judge.py uses it to decide
whether never-written memory reaches what the program keeps). Computations without a
pallas_call (the engine's own, the script's plain ones) pass through untouched.

JAX's C++ dispatch would run such a computation again without Python (its fast path);
it is refused for computations that hold a pallas_call, so that each run is seen here, and
for any that calls back into Python: JAX's C++ cache outlives the interception, whose
programs must not (patched_lowering.install keys JAX's caches rather than emptying them).
A call compiled ahead of time (`jax.jit(f).lower(x).compile()`) runs without this
function: its kernels are judged at their own boundary. A computation that donates
arguments is re-run on copies of them taken before it ran (intercept/donated.py, within a
memory bound), never on the script's buffers.

Installed with `kernel_options`, which gives XLA compiler options for a computation given
its kernels' params (None: none), such a computation is compiled with those options (its
own disabled passes kept), and `compiled_here()` tells the pallas_call lowering, while it
runs, that its module is compiled so: a kernel lowered inline
(intercept/patched_lowering.py) keeps the arithmetic the engine's own programs have
(pallas_check/engine/jaxpr/program.py, `SEGMENT_COMPILER_OPTIONS`).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import numpy as np

from pallas_check.intercept import donated
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge import lowering
from pallas_check.jaxbridge.jaxprs import sub_jaxprs
from pallas_check.jaxbridge import jit_dispatch, runs_host_callbacks, set_jit_dispatch

# Primitives that run a kernel through the patched pallas_call lowering (`pl.kernel` on a
# SparseCore mesh binds mpmd_map), matched by name in nested jaxprs too.
_KERNEL_PRIMITIVES = frozenset({"pallas_call", "mpmd_map"})
_EAGER_NAMES = frozenset({"wrapped", "pallas_call", "mpmd_map", "prim_fun"})


@dataclasses.dataclass(frozen=True, eq=False)
class OuterCall:
    """A top-level jitted computation that holds a pallas_call: its name (the jitted
    function's), the names of its side effects, whether it donates an argument (and
    whether copies of the donated ones were kept for a re-run, or why not), whether it is
    an eager pallas_call (its one equation is the kernel), and which kernels' outputs are
    its results."""

    name: str
    effects: tuple[str, ...] = ()
    donates: bool = False
    eager: bool = False
    # Kernels whose outputs are results as they are: a kernel's jaxpr (by id) that one
    # equation of the whole computation runs, at its top level -> per output, the
    # indices of the results that are that output.
    direct: dict = dataclasses.field(default_factory=dict)
    kept: bool = False  # its donated operands were copied before it ran (donated.py)
    unkept: str = ""  # why they were not, where a reason is worth telling

    def cannot_rerun(self) -> str | None:
        """Why running it again would change what the script sees (None: it would not)."""
        if self.donates and not self.kept:
            why = f" ({self.unkept})" if self.unkept else ""
            return f"{self.describe()} donates its arguments, so it cannot be re-run{why}"
        if self.effects:
            return (f"{self.describe()} has side effects ({', '.join(self.effects)}),"
                    " so it is not re-run")
        return None

    def describe(self) -> str:
        return "the eager pallas_call" if self.eager else f"jax.jit({self.name})"


class Listener(Protocol):
    def opened(self, call: OuterCall) -> Any:
        """The computation starts (the value returned is passed to `closed`)."""

    def closed(self, token: Any, outputs: Sequence[Any] | None,
               rerun: Callable[[], list[np.ndarray]] | None,
               error: BaseException | None) -> None:
        """It ended: its results (None if it raised `error`) and `rerun`, which runs it
        again on the same arguments and returns its results as numpy arrays."""


_lock = threading.Lock()
_saved: dict[str, Any] | None = None
_listener: Listener | None = None
# kernel_options(kernels' params) -> XLA compiler options, or None (see the module).
KernelOptions = Callable[[Sequence[Mapping[str, Any]]], "Mapping[str, str | bool] | None"]
_kernel_options: KernelOptions | None = None
# Whether the computation this thread just ran through the hook held a pallas_call: JAX
# asks for its fast-path data right after running it, on the same thread.
_last = threading.local()
_facts: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
# A program's jaxpr -> the options it was last compiled with.
_compiled_with: "weakref.WeakKeyDictionary[Any, Mapping[str, str | bool]]" = (
    weakref.WeakKeyDictionary())


def _remember_options(body: Any, options: Mapping[str, str | bool]) -> None:
    try:
        _compiled_with[body] = options
    except TypeError:  # not weakly referenceable: the modules are forgotten each run
        pass


def _kernel_facts(closed: Any) -> tuple[bool, dict, list[Mapping[str, Any]], bool]:
    """Whether a closed jaxpr runs a kernel anywhere, `direct` (see OuterCall), the
    params of each kernel equation, and whether every output of every kernel is a result
    as it is (what such kernels leave undecided is judged without a re-run); worked out
    once per jaxpr."""
    try:
        return _facts[closed]
    except (KeyError, TypeError):
        pass
    seen: dict[int, int] = {}  # a kernel jaxpr's id -> its equations anywhere
    kernels: list[Mapping[str, Any]] = []
    _count(closed.jaxpr, seen, kernels)
    outvars = list(closed.jaxpr.outvars)
    direct = {}
    for eqn in closed.jaxpr.eqns:
        kernel = eqn_params.maybe_body(eqn)
        if eqn.primitive.name in _KERNEL_PRIMITIVES and seen.get(id(kernel)) == 1:
            direct[id(kernel)] = tuple(tuple(k for k, v in enumerate(outvars) if v is out)
                                       for out in eqn.outvars)
    whole = set(seen) == set(direct) and all(all(direct[k]) for k in direct)
    facts = (bool(seen), direct, kernels, whole)
    try:
        _facts[closed] = facts
    except TypeError:  # not weakly referenceable: worked out again next time
        pass
    return facts


def _count(jaxpr: Any, seen: dict[int, int], kernels: list[Mapping[str, Any]]) -> None:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _KERNEL_PRIMITIVES:
            key = id(eqn_params.maybe_body(eqn))
            seen[key] = seen.get(key, 0) + 1
            kernels.append(eqn_params.kernel_call_params(eqn))
        for sub in sub_jaxprs(eqn):
            _count(sub, seen, kernels)


def _describe(params: dict, args: Sequence[Any]) -> tuple[OuterCall, donated.Kept | None]:
    """The computation about to run, and copies of its donated operands when a re-run
    may need them (intercept/donated.py)."""
    jit = eqn_params.jit_call(params)
    closed, name = jit.body, jit.name
    effects = tuple(sorted({type(e).__name__ for e in closed.effects}))
    eqns = closed.jaxpr.eqns
    # An eager pallas_call runs as JAX's jit of the call alone (pallas_call's own
    # `wrapped`, or the primitive's); the script's own jit of it has the script's name.
    eager = (len(eqns) == 1 and eqns[0].primitive.name in _KERNEL_PRIMITIVES
             and name in _EAGER_NAMES)
    facts = _kernel_facts(closed)
    call = OuterCall(name, effects, jit.donates, eager, facts[1])
    if not jit.donates or effects or (facts[3] and _one_device(args)):
        return call, None  # no re-run on copies: none may be needed, or none is possible
    kept = donated.keep(args, jit.donated)
    if isinstance(kept, str):
        return dataclasses.replace(call, unkept=kept), None
    return dataclasses.replace(call, kept=True), kept


def _one_device(args: Sequence[Any]) -> bool:
    """Whether every array argument lives on one device (a kernel's undecided elements
    then are on device 0, where judge.py judges a direct kernel without a re-run)."""
    return all(len(a.sharding.device_set) == 1 for a in args if isinstance(a, jax.Array))


def _call_impl_python(*args: Any, **params: Any) -> Any:
    original = _saved["impl"] if _saved is not None else None
    listener = _listener
    body = eqn_params.jit_body(params)
    facts = _kernel_facts(body)
    if original is None or listener is None or not facts[0]:
        result = (original or jit_dispatch()[0])(*args, **params)
        _last.kernel = False
        return result
    call, kept = _describe(params, args)
    token = listener.opened(call)
    options = _kernel_options(facts[2]) if _kernel_options is not None else None
    if options is not None:
        params = dict(eqn_params.with_compiler_options(params, options))
        if _compiled_with.get(body) != options:
            # JAX keeps the module it lowered per jaxpr, whatever the options: lowered
            # again, a kernel that now runs inline is lowered so.
            lowering.forget_lowered_modules()
            _remember_options(body, options)
    _last.compiling = options is not None
    try:
        out_flat, compiled, profiler, const_args = original(*args, **params)
        _last.compiling = False
        jax.block_until_ready(out_flat)  # every callback of the computation has run
    except BaseException as exc:
        _last.compiling = False
        if kept is not None:
            kept.release()
        listener.closed(token, None, None, exc)
        raise

    def rerun() -> list[np.ndarray]:
        again = kept.arguments(args) if kept is not None else args
        return [np.asarray(o) for o in compiled.unsafe_call(*const_args, *again)]

    try:
        listener.closed(token, out_flat, rerun, None)
    finally:
        if kept is not None:
            kept.release()
    # Set last: the engine's own computations may have run on this thread meanwhile
    # (XLA runs a small computation inline), each through this hook.
    _last.kernel = True
    return out_flat, compiled, profiler, const_args


def _fastpath_data(*args: Any, **kwargs: Any) -> Any:
    if getattr(_last, "kernel", False):
        _last.kernel = False
        return None  # run through Python each time: the hook sees every run
    if args and runs_host_callbacks(args[0]):
        # Nor any other that calls back into Python (one holding a kernel the facts above
        # missed): an executable of the interception's callbacks must never reach JAX's
        # C++ cache, which outlives it (patched_lowering.install `programs`).
        return None
    saved = _saved
    original = saved["fastpath"] if saved is not None else jit_dispatch()[1]
    return original(*args, **kwargs)


def compiled_here() -> bool:
    """Whether a computation holding a pallas_call is being lowered on this thread now, to
    be compiled with the hook's `kernel_options`."""
    return bool(getattr(_last, "compiling", False))


def install(listener: Listener, kernel_options: KernelOptions | None = None) -> None:
    """Tell `listener` of every top-level computation that holds a pallas_call (compiled
    with `kernel_options`, when given)."""
    global _saved, _listener, _kernel_options
    with _lock:
        if _saved is not None:
            raise RuntimeError("pallas-check's jit hook is already installed")
        impl, fastpath = jit_dispatch()
        _saved = {"impl": impl, "fastpath": fastpath}
        _listener, _kernel_options = listener, kernel_options
        set_jit_dispatch((_call_impl_python, _fastpath_data))


def listening(listener: Listener) -> bool:
    """Whether `listener` is the one told of top-level computations now."""
    return _listener is listener


def uninstall() -> None:
    global _saved, _listener, _kernel_options
    with _lock:
        if _saved is None:
            return
        set_jit_dispatch((_saved["impl"], _saved["fastpath"]))
        _saved, _listener, _kernel_options = None, None, None
