"""Arrays the script made with `jnp.empty` (or `jnp.empty_like`, `jax.lax.empty`): memory
nobody wrote.

jax 0.10 fills them with zeros on a CPU, but on a TPU (and on every backend from jax 0.11)
they hold whatever the memory held: a kernel that reads such an input before writing it
(the carry-in of a KV cache, an accumulator) reads garbage. While installed, the arrays
these functions return outside any trace are remembered by their buffer; a call whose
input is one of them (on one CPU device its operands are XLA's own buffers, lent:
intercept/hostcall.py) gets that input as never-written memory (the `--uninit` fill, no element
written), so that a read of it is `uninitialized`.

Not tracked: `jnp.empty` inside `jax.jit` (a broadcast of zeros there, like any other),
an array computed from an empty one (`cache.at[0].set(x)` is a new array), a kernel's
output aliased to an empty input, a name imported before the run started
(`from jax.numpy import empty`), and calls on several devices (their operands are copies).
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from pallas_check.jaxbridge.call import describe

_lock = threading.Lock()
# data pointer -> (the array, its size in bytes), for the live arrays made empty.
_tracked: dict[int, tuple[weakref.ref, int]] = {}
_saved: list[tuple[Any, str, Any]] | None = None


def _remember(array: Any) -> None:
    """Track `array` if it is a concrete array on one device (not a tracer), or a host
    array standing in for one (`stand_in`)."""
    try:
        pointer = (array.__array_interface__["data"][0] if isinstance(array, np.ndarray)
                   else int(array.unsafe_buffer_pointer()))
        nbytes = int(array.nbytes)
    except Exception:  # noqa: BLE001 - a tracer, or an array over several devices
        return
    if not pointer or not nbytes:
        return

    def forget(ref: weakref.ref, pointer: int = pointer) -> None:
        with _lock:
            if _tracked.get(pointer, (None,))[0] is ref:
                del _tracked[pointer]

    try:
        ref = weakref.ref(array, forget)
    except TypeError:
        return
    with _lock:
        _tracked[pointer] = (ref, nbytes)


def _tracking(make: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(make)
    def made(*args: Any, **kwargs: Any) -> Any:
        array = make(*args, **kwargs)
        _remember(array)
        return array

    made.__pallas_check_original__ = make  # type: ignore[attr-defined]
    return made


def _is_empty(operand: np.ndarray) -> bool:
    """Whether `operand` (a lent buffer) is the whole buffer of a live array made empty."""
    nbytes = operand.nbytes
    if not nbytes:
        return False
    pointer = operand.__array_interface__["data"][0]
    with _lock:
        entry = _tracked.get(pointer)
    if entry is None or entry[1] != nbytes:
        return False
    array = entry[0]()
    if isinstance(array, np.ndarray):  # a host array standing in for one (`stand_in`)
        return True
    try:
        return (array is not None and not array.is_deleted()
                and int(array.unsafe_buffer_pointer()) == pointer)
    except Exception:  # noqa: BLE001 - deleted or moved meanwhile: not the same memory
        return False


def never_written_inputs(params: dict, operands: Sequence[np.ndarray]) -> frozenset[int]:
    """The call's inputs (by position among its inputs, after the dynamic grid bounds and
    the scalar prefetch) that are arrays made empty."""
    if not _tracked:
        return frozenset()
    call = describe(params)
    first = call.num_grid_bounds + call.num_scalars
    inputs = list(operands)[first: first + call.num_inputs]
    return frozenset(i for i, a in enumerate(inputs)
                     if isinstance(a, np.ndarray) and _is_empty(a))


def stand_in(params: dict, operands: Sequence[np.ndarray],
             standing: Sequence[np.ndarray]) -> None:
    """`standing` (host arrays: a recording's operands, `pallas-check replay`) stand for
    the call's `operands`: each that stands for an array made empty is one too, for as
    long as it lives."""
    found = never_written_inputs(params, operands)
    if found:
        call = describe(params)
        first = call.num_grid_bounds + call.num_scalars
        for i in found:
            _remember(standing[first + i])


def install() -> None:
    """Track the arrays `jnp.empty`, `jnp.empty_like` and `jax.lax.empty` make from now on."""
    global _saved
    import jax
    import jax.numpy as jnp

    with _lock:
        if _saved is not None:
            return
        _saved = [(module, name, getattr(module, name))
                  for module, name in ((jnp, "empty"), (jnp, "empty_like"), (jax.lax, "empty"))
                  if hasattr(module, name)]
        for module, name, make in _saved:
            setattr(module, name, _tracking(make))


def uninstall() -> None:
    global _saved
    with _lock:
        if _saved is None:
            return
        for module, name, make in _saved:
            setattr(module, name, make)
        _saved = None
        _tracked.clear()
