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
from typing import Any, Callable, Hashable


class BoundedCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get_or_make(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value under `key`, made (outside the lock) on a miss."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            value = self._items.setdefault(key, value)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def for_object(self, obj: Any, extra: Hashable, make: Callable[[], Any]) -> Any:
        """The value for `obj` itself (by identity, held weakly: a dead object's entry is
        never answered for a new one at the same address) and `extra`."""
        key = (id(obj), extra)
        with self._lock:
            entry = self._items.get(key)
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


def by_identity(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fn(obj)` remembered by the object's identity, for objects that live long and cannot
    be weakly referenced (a jaxpr equation's pytree structure): the entry holds the object,
    so its id stays its own; bounded by clearing. Unlocked, unlike `BoundedCache`: it is
    on the per-DMA path, where hashing a structure (its indexers' shapes and static
    slices) or taking a lock cost more than the lookup served; a race between threads
    only computes a value twice."""
    entries: dict[int, tuple[Any, Any]] = {}

    def lookup(obj: Any) -> Any:
        entry = entries.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        value = fn(obj)
        if len(entries) >= 4096:
            entries.clear()
        entries[id(obj)] = (obj, value)
        return value

    return lookup
