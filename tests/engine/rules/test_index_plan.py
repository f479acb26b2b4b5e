"""engine/index_plan: a ref's indexers read straight from an equation's flat operands give
exactly the region the general path (JAX's indexer objects, `resolve`) gives, and
every spelling the plan does not cover falls back to that path."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax._src import tree_util
from jax._src.state import indexing, types as state_types
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.engine.rules import index_plan
from pallas_check.engine.memory.region import Region, resolve
from pallas_check.engine.memory.buffer import Buffer, RefView


def _flat(ref: RefView, *indexers):
    """The flat operands and pytree structure of `ref.at[...]...`, as an equation has them
    (JAX's tracing registry makes a TransformedRef a node; the ref is a leaf). The
    indexers are built without JAX's bounds validation: out-of-bounds ones are cases."""
    shape = ref.buffer.shape
    transforms = []
    for indices in indexers:
        transforms.append(indexing.NDIndexer(tuple(indices), shape, ()))
        shape = tuple(i.size for i in indices if isinstance(i, indexing.Slice))
    return tree_util.tracing_registry.flatten(
        state_types.TransformedRef(ref, tuple(transforms)))


def _same_region(a: Region, b: Region) -> None:
    assert a.buffer is b.buffer
    assert a.dims == b.dims and a.index == b.index and a.out_shape == b.out_shape
    assert [(o.dim, o.index, o.size) for o in a.oob] == [(o.dim, o.index, o.size) for o in b.oob]
    assert a.post == b.post == []


def _planned_and_general(leaves, tree):
    plan = index_plan.plan_for(tree)
    assert plan is not None
    built = tree.unflatten(leaves)  # JAX's own objects: what the general path reads
    general = resolve(RefView(built.ref.buffer, tuple(built.transforms)))
    return plan.region(leaves, leaves[plan.ref]), general


_index_kinds = st.sampled_from(["np", "jax", "int"])


def _as_kind(value: int, kind: str):
    return {"np": np.int32(value), "jax": jnp.int32(value), "int": value}[kind]


@st.composite
def _indexing(draw):
    """A buffer of rank 1-3 and one or two indexers over it: ints and slices with dynamic
    or static starts, strides 0-2, in bounds or up to 2 past either end."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    indexers, live = [], list(shape)
    for _ in range(draw(st.integers(1, 2))):
        if not live:
            break
        indices, next_live = [], []
        for n in live:
            if draw(st.booleans()) and len(live) > 1:
                indices.append(_as_kind(draw(st.integers(-2, n + 1)), draw(_index_kinds)))
                continue
            size = draw(st.integers(0, n))
            stride = draw(st.sampled_from([1, 1, 2, 0]))
            start = draw(st.integers(-2, n + 1))
            if draw(st.booleans()):  # a static start (pytree aux data, not an operand)
                indices.append(indexing.Slice(start, size, stride))
            else:
                indices.append(indexing.Slice(_as_kind(start, draw(_index_kinds)), size,
                                              stride))
            next_live.append(size)
        indexers.append(tuple(indices))
        live = next_live
    return shape, indexers


@settings(max_examples=150, deadline=None)
@given(_indexing())
def test_a_planned_region_is_the_general_one(case):
    shape, indexers = case
    ref = RefView(Buffer("x", "VMEM", np.zeros(shape, np.float32), True))
    leaves, tree = _flat(ref, *indexers)
    fast, general = _planned_and_general(leaves, tree)
    assert fast is not None
    _same_region(fast, general)
    # The plan's straight-line code answers exactly the plain in-bounds accesses.
    plan = index_plan.plan_for(tree)
    straight = plan._in_bounds(leaves, ref.buffer)
    plain = not general.oob and all(i.size > 0 and i.stride != 0 for indices in indexers
                                    for i in indices if isinstance(i, indexing.Slice))
    assert (straight is not None) == plain
    if straight is not None:
        _same_region(straight, general)


def test_a_get_style_tree_of_transforms_and_a_bare_ref():
    ref = RefView(Buffer("x", "SMEM", np.zeros((4, 8), np.int32), True))
    leaves, tree = tree_util.tree_flatten(
        (indexing.NDIndexer.from_indices_shape((np.int32(3), indexing.Slice(2, 4)), (4, 8)),))
    plan = index_plan.plan_for(tree)
    assert plan is not None and plan.ref is None
    region = plan.region(leaves, ref)
    assert region.index == (3, slice(2, 6, 1)) and region.out_shape == (4,) and not region.oob
    bare_leaves, bare_tree = tree_util.tracing_registry.flatten(ref)
    bare = index_plan.plan_for(bare_tree)
    assert bare is not None and bare.region(bare_leaves, ref).index == (slice(0, 4, 1),
                                                                      slice(0, 8, 1))
    # The whole buffer, by the straight-line path, is the general path's region.
    whole = bare._in_bounds(bare_leaves, ref.buffer)
    assert whole is not None
    _same_region(whole, resolve(ref))


def test_what_the_plan_does_not_cover_goes_the_general_way():
    buffer = Buffer("x", "VMEM", np.zeros((8, 16), np.float32), True)
    ref = RefView(buffer)
    # A bitcast (a transform that is no indexer): no plan.
    bitcast = state_types.TransformedRef(ref, (state_types.BitcastTransform(jnp.int32),))
    assert index_plan.plan_for(tree_util.tracing_registry.flatten(bitcast)[1]) is None
    # An array of indices (a gather), a ref that carries transforms already: no region.
    leaves, tree = tree_util.tracing_registry.flatten(state_types.TransformedRef(
        ref, (indexing.NDIndexer((np.array([1, 2]), indexing.Slice(0, 16)), (8, 16), (2,)),)))
    assert index_plan.plan_for(tree).region(leaves, ref) is None
    leaves, tree = _flat(ref, (np.int32(1), indexing.Slice(0, 16)))
    carrying = RefView(buffer, (indexing.NDIndexer(
        (indexing.Slice(0, 8), indexing.Slice(0, 16)), (8, 16), ()),))
    assert index_plan.plan_for(tree).region(leaves, carrying) is None


def test_a_traced_size_has_no_plan_and_is_seen_as_dynamic():
    """`pl.ds(start, n)` with a traced n: the size is a leaf; no plan (the planned DMA
    start and wait, whose bytes are static, never take it), and a wait keys its cached
    bytes on the leaves (`has_dynamic_size`)."""
    ref = RefView(Buffer("x", "VMEM", np.zeros((8, 16), np.float32), True))
    traced = object()  # as a jaxpr variable is: no int (a concrete int is static)
    leaves, tree = _flat(ref, (indexing.Slice(0, traced), indexing.Slice(0, 16)))
    assert leaves[1] is traced  # the ref, then the size
    assert index_plan.plan_for(tree) is None
    assert index_plan.has_dynamic_size(tree)
    _, tree = _flat(ref, (indexing.Slice(traced, 3), indexing.Slice(0, 16)))  # a start
    assert not index_plan.has_dynamic_size(tree)
    assert index_plan.plan_for(tree) is not None


def _paged_copy_kernel(pages_ref, x_hbm, o_ref, buf, sem):
    """Copy rows named by a scalar-prefetched table, one DMA per row, all started before
    any is waited (as a paged attention does with pages)."""
    n = o_ref.shape[0]

    def copy(i):
        return pltpu.make_async_copy(x_hbm.at[pages_ref[i]], buf.at[i], sem)

    for i in range(n):
        copy(i).start()
    for i in range(n):
        copy(i).wait()
    o_ref[...] = buf[...] + 1.0


def _paged_copy(table_call, n):
    return table_call(_paged_copy_kernel, n,
                      [pltpu.VMEM((n, 128), jnp.float32), pltpu.SemaphoreType.DMA(())])


_lines, _first = inspect.getsourcelines(_paged_copy_kernel)
_START_LINE = _first + next(i for i, text in enumerate(_lines) if "copy(i).start()" in text)


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER])
def test_dmas_by_a_page_table_copy_the_named_rows(check, table_call, mode):
    x = jax.random.normal(jax.random.key(1), (16, 128), jnp.float32)
    pages = jnp.array([3, 15, 0, 3, 9, 2, 7, 11], jnp.int32)
    r = check(_paged_copy(table_call, 8), pages, x, config=Config(dma_mode=mode, races=True))
    assert r.findings == []
    np.testing.assert_array_equal(np.asarray(r.value), np.asarray(x[pages] + 1.0))


def test_a_page_index_past_the_end_is_an_out_of_bounds_dma_source(check, table_call):
    x = jax.random.normal(jax.random.key(2), (16, 128), jnp.float32)
    pages = jnp.array([3, 15, 16, 3, 9, 2, 7, 11], jnp.int32)  # row 16 of 16
    r = check(_paged_copy(table_call, 8), pages, x, config=Config(dma_mode=DmaMode.ON_WAIT))
    [finding] = [f for f in r.findings if f.kind.value == "out-of-bounds"]
    assert finding.buffer == "x_hbm" and finding.index_range == ((16, 17), (0, 128))
    assert finding.frames[0].line == _START_LINE
    assert "DMA source" in finding.message
