"""memory.AccessCache: a `ref[indices]` region resolved once per call for the same equation,
ref and index values, and never confused between refs, indices or array indices."""

from __future__ import annotations

import numpy as np

from pallas_check.engine.memory import AccessCache, Buffer, RefView


def _counting():
    made = []

    def make(tag):
        def run():
            made.append(tag)
            return object()
        return run

    return made, make


def test_same_equation_ref_and_indices_resolve_once():
    cache, (made, make) = AccessCache(), _counting()
    eqn, ref = object(), RefView(Buffer("x", "VMEM", np.zeros((4, 8), np.float32), True))
    first = cache.get_or_make(eqn, [ref, np.int32(2), 3], make("a"))
    again = cache.get_or_make(eqn, [ref, 2, np.int64(3)], make("b"))
    assert again is first and made == ["a"]
    other_index = cache.get_or_make(eqn, [ref, 1, 3], make("c"))
    other_ref = cache.get_or_make(
        eqn, [RefView(ref.buffer), 2, 3], make("d"))  # an equal view, another object
    other_eqn = cache.get_or_make(object(), [ref, 2, 3], make("e"))
    assert len({id(first), id(other_index), id(other_ref), id(other_eqn)}) == 4
    assert made == ["a", "c", "d", "e"]


def test_array_indices_and_unknown_leaves_are_never_cached():
    cache, (made, make) = AccessCache(), _counting()
    eqn, ref = object(), RefView(Buffer("x", "VMEM", np.zeros((4, 8), np.float32), True))
    gather = np.array([0, 2])
    a = cache.get_or_make(eqn, [ref, gather], make("a"))
    b = cache.get_or_make(eqn, [ref, gather], make("b"))
    c = cache.get_or_make(eqn, ["not a ref"], make("c"))
    d = cache.get_or_make(eqn, ["not a ref"], make("d"))
    assert a is not b and c is not d and made == ["a", "b", "c", "d"]


def test_bounded():
    cache, (made, make) = AccessCache(limit=3), _counting()
    eqn, ref = object(), RefView(Buffer("x", "VMEM", np.zeros((4, 8), np.float32), True))
    for i in range(5):
        cache.get_or_make(eqn, [ref, i], make(i))
    assert len(cache._entries) <= 3
    cache.get_or_make(eqn, [ref, 4], make("again"))
    assert made[-1] == 4  # the newest entry survived the clearing
