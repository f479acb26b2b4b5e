"""A kernel's accesses remembered by their index: the same `x_ref[i, :]` at the same
step resolves to the same region, so its resolution is cached per call (see `AccessCache`).
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import numpy as np
from pallas_check.jaxbridge.types import TypedInt

from pallas_check.engine.memory.buffer import RefView


_V = TypeVar("_V")  # what a cached `make` returns

_NUMPY_INTS = frozenset({np.int32, np.int64, np.uint32, np.int16, np.int8, np.uint8,
                         np.uint16, np.uint64, np.bool_})


def scalar_index(x: object) -> int | None:
    """A scalar integer index as a Python int; None for anything else (an array of
    indices: a gather). On every access: the common kinds first, by exact class."""
    kind = x.__class__
    if kind is int:
        return x  # type: ignore[return-value]  # an int (`__class__` is not narrowed)
    if kind in _NUMPY_INTS or isinstance(x, (int, np.integer)):  # JAX's typed literals too
        return int(x)  # type: ignore[call-overload, no-any-return]  # an int kind
    if getattr(x, "ndim", None) == 0 and np.dtype(getattr(x, "dtype")).kind in "biu":
        return int(np.asarray(x))
    return None


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]


_CONVERT = _Unhashable()  # in a key: a leaf that needs `scalar_index` first


# Hashed and compared as the ints they hold: a jaxpr's integer literals (an index written
# as a constant in the kernel) among them; and tuples, which no pytree has as a leaf: a
# buffer's layout standing for every buffer of that shape (rules/access.py `_region_of`).
_PLAIN_LEAVES = _NUMPY_INTS | {int, bool, type(None), TypedInt, tuple}


class AccessCache:
    """Per call: the region a `ref[indices]` equation touches, by the equation, the refs
    and the scalar index values. A BlockSpec grid or a loop runs the same equation on the
    same refs with the same indices at step after step, and resolving (indexer pytrees,
    bounds, numpy indices) cost more than the access. A region depends only on the view
    and the buffer's shape. A DMA wait's size and semaphore, and a DMA start's local ref
    arguments, are cached the same way (engine/rules/dma.py; a paged kernel's source pages
    miss every time, and a miss costs only its key)."""

    def __init__(self, limit: int = 4096) -> None:
        # key -> (the equation, the refs among the leaves: kept alive, so that their ids
        # stay theirs; the value made)
        self._entries: dict[tuple[object, ...], tuple[object, list[RefView], object]] = {}
        self._limit = limit

    def get_or_make(self, eqn: object, leaves: Sequence[object], make: Callable[[], _V]) -> _V:
        # Refs by identity; ints as they are (a numpy int or a jaxpr's typed literal
        # hashes and compares as the int it holds). Any other leaf (a jax scalar, an array
        # of indices) makes the key unhashable: the slower spelling then converts each index.
        key = (id(eqn), *[id(x) if x.__class__ is RefView
                          else x if x.__class__ in _PLAIN_LEAVES else _CONVERT
                          for x in leaves])
        try:
            hit = self._entries.get(key)
        except TypeError:
            return self._get_or_make_converted(eqn, leaves, make)
        if hit is not None:  # the entry keeps its equation and refs alive: same ids, same objects
            # (made by a `make` of this equation's caller: its type; no cast on this path)
            return hit[2]  # type: ignore[return-value]
        return self._store(key, eqn, leaves, make())

    def get_or_make_plain(self, eqn: object, leaves: Sequence[object],
                          make: Callable[[], _V]) -> _V:
        """`get_or_make` for leaves none of which is a ref (a buffer's layout and scalar
        indices): the leaves themselves are the key when they hash (ints do), without
        looking at each first; anything else takes `get_or_make`."""
        key = (id(eqn), *leaves)
        try:
            hit = self._entries.get(key)
        except TypeError:  # a jax scalar, an array of indices
            return self.get_or_make(eqn, leaves, make)
        if hit is not None:
            return hit[2]  # type: ignore[return-value]  # (as in get_or_make)
        return self._store(key, eqn, leaves, make())

    def _get_or_make_converted(self, eqn: object, leaves: Sequence[object],
                               make: Callable[[], _V]) -> _V:
        parts: list[object] = [id(eqn)]
        for x in leaves:
            if x.__class__ is RefView:
                parts.append(id(x))
            elif x is None or x.__class__ is tuple:
                parts.append(x)
            else:
                value = scalar_index(x)
                if value is None:
                    return make()  # an array of indices (a gather), or not a ref: every time
                parts.append(value)
        key = tuple(parts)
        hit = self._entries.get(key)
        if hit is not None:
            return hit[2]  # type: ignore[return-value]  # (as in get_or_make)
        return self._store(key, eqn, leaves, make())

    def _store(self, key: tuple[object, ...], eqn: object, leaves: Sequence[object], value: _V
               ) -> _V:
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[key] = (eqn, [x for x in leaves if x.__class__ is RefView], value)
        return value


