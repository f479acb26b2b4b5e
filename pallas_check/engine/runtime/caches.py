"""The engine's caches of compiled pieces, bounded.

`BoundedCache` (thread-safe, least recently used evicted first) keeps three: programs by
jaxpr identity, compiled segments by structure, index maps by identity then structure. An
eager call traces a new jaxpr each time, so identity alone would miss and grow; structure
alone would print the jaxpr at every call. `by_identity` remembers what is derived from a
pytree structure (a DMA's argument layout, an index plan) on the per-access path.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Callable, Hashable, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


class BoundedCache:
    """Values of any type: each is what `make` returned for its key (a key names one
    kind of value: the typed methods hand it back as that type)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: collections.OrderedDict[Hashable, object] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get_or_make(self, key: Hashable, make: Callable[[], T]) -> T:
        """The value under `key`, made (outside the lock) on a miss."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return cast(T, self._items[key])
        value: object = make()
        with self._lock:
            value = self._items.setdefault(key, value)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return cast(T, value)

    def for_object(self, obj: object, extra: Hashable, make: Callable[[], T]) -> T:
        """The value for `obj` itself (by identity, held weakly: a dead object's entry is
        never answered for a new one at the same address) and `extra`."""
        key = (id(obj), extra)
        with self._lock:
            entry = cast("tuple[weakref.ref[object], T] | None", self._items.get(key))
            if entry is not None and entry[0]() is obj:
                self._items.move_to_end(key)
                return entry[1]
        value = make()
        with self._lock:
            self._items[key] = (weakref.ref(obj), value)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)


def by_identity(fn: Callable[[T], R]) -> Callable[[T], R]:
    """`fn(obj)` remembered by the object's identity, for objects that live long and cannot
    be weakly referenced (a jaxpr equation's pytree structure): the entry holds the object,
    so its id stays its own; bounded by clearing. Unlocked, unlike `BoundedCache`: it is
    on the per-DMA path, where hashing a structure (its indexers' shapes and static
    slices) or taking a lock cost more than the lookup served; a race between threads
    only computes a value twice."""
    entries: dict[int, tuple[T, R]] = {}

    def lookup(obj: T) -> R:
        entry = entries.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        value = fn(obj)
        if len(entries) >= 4096:
            entries.clear()
        entries[id(obj)] = (obj, value)
        return value

    return lookup
