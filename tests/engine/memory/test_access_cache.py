"""memory.AccessCache: a `ref[indices]` region (and a DMA wait's size and semaphore) resolved
once per call for the same equation, refs and index values, never confused between refs,
indices or array indices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.engine.memory.access_cache import AccessCache
from pallas_check.engine.memory.buffer import Buffer, RefView


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


def test_a_jaxpr_literal_index_keys_like_the_int_it_holds(monkeypatch):
    """A constant index in a kernel reaches a rule as JAX's TypedInt: the fast key takes it
    as it is (the converting path, per element, is for jax scalars and index arrays)."""
    from pallas_check.jaxbridge.types import TypedInt

    cache, (made, make) = AccessCache(), _counting()
    eqn, ref = object(), RefView(Buffer("x", "VMEM", np.zeros((4, 8), np.float32), True))

    def no_conversion(*args):
        raise AssertionError("a typed literal took the converting path")

    monkeypatch.setattr(cache, "_get_or_make_converted", no_conversion)
    first = cache.get_or_make(eqn, [ref, TypedInt(2, np.dtype(np.int32)), 3], make("a"))
    assert cache.get_or_make(eqn, [ref, 2, np.int32(3)], make("b")) is first
    other = cache.get_or_make(eqn, [ref, TypedInt(1, np.dtype(np.int32)), 3], make("c"))
    assert other is not first and made == ["a", "c"]


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


def _gather_rows_kernel(idx_ref, x_hbm, o_ref, buf, sem):
    """Copy 8-row chunks from data-dependent offsets, double-buffered; each wait names a
    descriptor with another source offset (only its size counts), as paged kernels do."""
    n = o_ref.shape[0] // 8

    def copy(i, slot):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(idx_ref[i] * 8, 8)], buf.at[slot],
                                     sem.at[slot])

    copy(0, 0).start()

    def body(i, carry):
        slot = i % 2

        @pl.when(i + 1 < n)
        def _():
            copy(i + 1, 1 - slot).start()

        pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf.at[slot], sem.at[slot]).wait()
        o_ref[pl.ds(pl.multiple_of(i * 8, 8), 8), :] = buf[slot] * 2.0
        return carry

    jax.lax.fori_loop(0, n, body, 0)


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER])
def test_waits_cached_across_source_offsets_and_slots(check, table_call, mode):
    x = jax.random.normal(jax.random.key(0), (64, 128), jnp.float32)
    idx = jnp.array([5, 0, 7, 7, 2, 1], jnp.int32)
    gather_rows = table_call(_gather_rows_kernel, idx.shape[0] * 8,
                             [pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))])
    r = check(gather_rows, idx, x, config=Config(dma_mode=mode, races=True))
    assert r.findings == []
    want = (x.reshape(8, 8, 128)[np.asarray(idx)] * 2.0).reshape(-1, 128)
    np.testing.assert_array_equal(np.asarray(r.value), np.asarray(want))


def test_jax_literal_ints_are_cached():
    """Indices that reach a rule as JAX's own int subclasses (literals of a jaxpr) and as
    0-d arrays hit the cache like plain ints (a miss at every access made flash attention
    30% slower)."""
    from jax._src.literals import TypedInt  # what jax 0.10 binds for a typed int literal

    cache, (made, make) = AccessCache(), _counting()
    eqn, ref = object(), RefView(Buffer("x", "VMEM", np.zeros((4, 8), np.float32), True))
    literal = TypedInt(3, np.dtype(np.int32))
    assert not hasattr(literal, "shape")
    cache.get_or_make(eqn, [ref, literal], make("a"))
    cache.get_or_make(eqn, [ref, jnp.int32(3)], make("b"))
    cache.get_or_make(eqn, [ref, 3], make("c"))
    assert made == ["a"], (type(literal), made)


def test_plain_leaves_key_an_entry_shared_by_every_buffer_of_a_layout():
    """`get_or_make_plain` (rules/access.py's regions of refs with no transforms): a
    buffer's (shape, memory space) and the indices are the key, so 32 subcores' scratch
    buffers share one entry; another layout, index or equation is another entry, and a
    leaf that does not hash (a jax scalar) is converted as `get_or_make` converts it."""
    cache, (made, make) = AccessCache(), _counting()
    eqn = object()
    layout = ((2, 32, 128), "VMEM")
    first = cache.get_or_make_plain(eqn, [layout, np.int32(1), 5], make("a"))
    assert cache.get_or_make_plain(eqn, [((2, 32, 128), "VMEM"), 1, np.int64(5)],
                                   make("b")) is first
    assert cache.get_or_make_plain(eqn, [layout, jnp.int32(1), 5], make("c")) is first
    others = [cache.get_or_make_plain(eqn, [((2, 32, 128), "SMEM"), 1, 5], make("d")),
              cache.get_or_make_plain(eqn, [((2, 16, 128), "VMEM"), 1, 5], make("e")),
              cache.get_or_make_plain(eqn, [layout, 0, 5], make("f")),
              cache.get_or_make_plain(object(), [layout, 1, 5], make("g"))]
    assert made == ["a", "d", "e", "f", "g"] and first not in others
