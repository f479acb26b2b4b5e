"""SparseCore vector ops (issue 28 item 5), each run in a one-subcore VectorSubcoreMesh
kernel under pallas-check and compared with a numpy reference written here, at the edges:
masks all off, duplicate indices, ties in sorts (stable; descending), int32 negatives, lanes
L=8 (v6e) and L=16 (v7x). The memory-touching ops are also checked through the memory
model: out-of-bounds lanes, reads of never-written memory, undefined lanes.

JAX cannot run these kernels on a CPU (its interpreter has no SparseCore): numpy is the
only oracle.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from pallas_check.config import Config
from pallas_check.engine.rules import sc_values, sparsecore
from jax._src.pallas.mosaic import sc_primitives  # the oracle: JAX's primitives
from pallas_check.intercept.session import Session

GENS = {"v6e": 8, "v7x": 16}
gens = pytest.mark.parametrize("gen", list(GENS))


class Ran:
    def __init__(self, value, session):
        self.outs = [np.asarray(v) for v in jax.tree.leaves(value)]
        self.findings = session.findings
        self.error = session.engine_error

    def kinds(self):
        return [f.kind.value for f in self.findings]


def run_sc(gen, body, ins, outs, scratch=()):
    """Run `body(in_vmem..., out_vmem..., scratch...)` on one vector subcore of `gen`:
    each input copied into VMEM first, each output VMEM copied out after. Buffers are named
    `refs[k]` in findings: the HBM inputs, the HBM outputs, then the VMEM refs in order."""
    ins = [np.asarray(a) for a in ins]
    session = Session(Config(tpu=gen))
    with session.install():
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=1, num_subcores=1)
        out_type = tuple(jax.ShapeDtypeStruct(s, d) for s, d in outs)
        vmem = ([pltpu.VMEM(a.shape, a.dtype) for a in ins]
                + [pltpu.VMEM(s, d) for s, d in outs] + list(scratch))
        n_in, n_out = len(ins), len(outs)

        @pl.kernel(out_type=out_type, mesh=mesh, scratch_types=vmem,
                   compiler_params=pltpu.CompilerParams(needs_layout_passes=False))
        def kernel(*refs):
            hbm_in, hbm_out = refs[:n_in], refs[n_in:n_in + n_out]
            local = refs[n_in + n_out:]
            for h, v in zip(hbm_in, local[:n_in]):
                pltpu.sync_copy(h, v)
            body(*local)
            for v, h in zip(local[n_in:n_in + n_out], hbm_out):
                pltpu.sync_copy(v, h)

        value = jax.block_until_ready(kernel(*[jnp.asarray(a) for a in ins]))
    ran = Ran(value, session)
    assert ran.error is None, ran.error
    return ran


def masks(L):
    """Mask patterns: all on, all off, alternating, only the last lane."""
    return {"all": np.ones(L, bool), "none": np.zeros(L, bool),
            "odd": np.arange(L) % 2 == 1, "last": np.arange(L) == L - 1}


MASKS = ["all", "none", "odd", "last"]


# -- load_gather --------------------------------------------------------------------------

@gens
@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_load_gather_active_lanes_read_their_index_duplicates_too(gen, which, dtype):
    L = GENS[gen]
    x = (np.arange(4 * L) - 2 * L).astype(dtype)  # negatives
    idx = ((np.arange(L) * 5) % 3).astype(np.int32)  # duplicates: 0, 2, 1, 0, ...
    mask = masks(L)[which]

    def body(x_v, i_v, m_v, o_v):
        m = m_v[...] != 0
        g = plsc.load_gather(x_v, [i_v[...]], mask=m)
        o_v[...] = jnp.where(m, g, jnp.zeros_like(g))  # inactive lanes never used

    r = run_sc(gen, body, [x, idx, mask.astype(np.int32)], [((L,), dtype)])
    np.testing.assert_array_equal(r.outs[0], np.where(mask, x[idx], 0))
    assert r.findings == []


@gens
def test_load_gather_2d_ref_two_index_vectors(gen):
    L = GENS[gen]
    x = np.arange(4 * L, dtype=np.int32).reshape(4, L) - 7
    rows = (np.arange(L) % 4).astype(np.int32)
    cols = (np.arange(L)[::-1]).astype(np.int32)

    def body(x_v, r_v, c_v, o_v):
        o_v[...] = plsc.load_gather(x_v, [r_v[...], c_v[...]])

    r = run_sc(gen, body, [x, rows, cols], [((L,), np.int32)])
    np.testing.assert_array_equal(r.outs[0], x[rows, cols])
    assert r.findings == []


@gens
def test_load_gather_lane_past_the_end_is_out_of_bounds_naming_the_lane(gen):
    L = GENS[gen]
    x = np.arange(2 * L, dtype=np.int32)
    idx = np.arange(L, dtype=np.int32)
    idx[3] = 2 * L + 5

    def body(x_v, i_v, o_v):
        o_v[...] = plsc.load_gather(x_v, [i_v[...]])

    r = run_sc(gen, body, [x, idx], [((L,), np.int32)])
    oob = [f for f in r.findings if f.kind.value == "out-of-bounds"]
    assert len(oob) == 1, r.findings
    assert oob[0].buffer == "refs[3]" and oob[0].index_range == ((2 * L + 5, 2 * L + 6),)
    assert "load_gather lane 3" in oob[0].message
    assert oob[0].frames[0].line > 0


@gens
def test_load_gather_masked_off_lane_past_the_end_is_not_read(gen):
    L = GENS[gen]
    x = np.arange(2 * L, dtype=np.int32)
    idx = np.arange(L, dtype=np.int32)
    idx[3] = 1000

    def body(x_v, i_v, o_v):
        i = i_v[...]
        m = i < 2 * L
        o_v[...] = jnp.where(m, plsc.load_gather(x_v, [i], mask=m), -1)

    r = run_sc(gen, body, [x, idx], [((L,), np.int32)])
    assert r.findings == []
    inside = idx < 2 * L
    np.testing.assert_array_equal(r.outs[0], np.where(inside, x[np.where(inside, idx, 0)], -1))


@gens
def test_load_gather_inactive_lanes_reaching_an_output_are_reported(gen):
    L = GENS[gen]
    x = np.arange(L, dtype=np.int32)

    def body(x_v, o_v):
        v = x_v[...]
        o_v[...] = plsc.load_gather(x_v, [v], mask=v > 2)  # lanes 0..2 undefined

    r = run_sc(gen, body, [x], [((L,), np.int32)])
    assert r.kinds() == ["uninitialized"], r.findings
    f = r.findings[0]
    assert f.details["output_range"] == [[0, 3]]
    assert f.buffer == "masked-off lanes of load_gather(refs[2])"  # x_v
    assert "masked-off lanes of a load_gather are undefined" in f.message


@gens
def test_load_gather_of_never_written_elements_is_an_uninitialized_read(gen):
    L = GENS[gen]

    def body(i_v, o_v, s_v):
        s_v[pl.ds(0, L)] = jnp.zeros((L,), jnp.int32)  # s_v[L:] never written
        o_v[...] = plsc.load_gather(s_v, [i_v[...]])

    idx = np.arange(L, dtype=np.int32) * 2  # half of them in the unwritten half
    r = run_sc(gen, body, [idx], [((L,), np.int32)], [pltpu.VMEM((2 * L,), jnp.int32)])
    assert r.kinds() == ["uninitialized"], r.findings
    assert r.findings[0].buffer == "refs[4]"  # s_v


# -- store_scatter / addupdate_scatter ------------------------------------------------------

@gens
@pytest.mark.parametrize("which", MASKS)
def test_store_scatter_writes_active_lanes_only(gen, which):
    L = GENS[gen]
    x = (np.arange(L) - L // 2).astype(np.int32)
    perm = np.random.default_rng(L).permutation(2 * L)[:L].astype(np.int32)
    mask = masks(L)[which]

    def body(x_v, i_v, m_v, o_v):
        o_v[...] = jnp.full((2 * L,), 99, jnp.int32)
        plsc.store_scatter(o_v, [i_v[...]], x_v[...], mask=m_v[...] != 0)

    r = run_sc(gen, body, [x, perm, mask.astype(np.int32)], [((2 * L,), np.int32)])
    want = np.full(2 * L, 99, np.int32)
    want[perm[mask]] = x[mask]
    np.testing.assert_array_equal(r.outs[0], want)
    assert r.findings == []


@gens
def test_store_scatter_duplicate_lanes_with_equal_values_store_that_value(gen):
    L = GENS[gen]

    def body(o_v):
        o_v[...] = jnp.zeros((L,), jnp.int32)
        plsc.store_scatter(o_v, [jnp.zeros((L,), jnp.int32)], jnp.full((L,), 7, jnp.int32))

    r = run_sc(gen, body, [], [((L,), np.int32)])
    np.testing.assert_array_equal(r.outs[0], np.r_[7, np.zeros(L - 1, np.int32)])
    assert r.findings == []


@gens
def test_store_scatter_duplicate_lanes_with_different_values_are_undefined(gen):
    """DESIGN §6 question 1: which lane lands is unspecified; the element is undefined
    (the fill value) and an output depending on it is reported."""
    L = GENS[gen]

    def body(o_v):
        o_v[...] = jnp.zeros((L,), jnp.int32)
        idx = jnp.where(jax.lax.iota(jnp.int32, L) < 2, 5, jax.lax.iota(jnp.int32, L))
        plsc.store_scatter(o_v, [idx % L], jax.lax.iota(jnp.int32, L) + 10)

    r = run_sc(gen, body, [], [((L,), np.int32)])
    assert r.kinds() == ["uninitialized"], r.findings
    assert r.findings[0].details["output_range"] == [[5, 6]]
    assert "which lands is unspecified" in r.findings[0].message
    want = np.arange(L) + 10
    want[5] = np.iinfo(np.int32).max  # the fill value of --uninit nan for int32
    want[0:2] = 0
    np.testing.assert_array_equal(r.outs[0], want)


@gens
def test_store_scatter_lane_out_of_bounds(gen):
    L = GENS[gen]

    def body(o_v):
        o_v[...] = jnp.zeros((L,), jnp.int32)
        plsc.store_scatter(o_v, [jax.lax.iota(jnp.int32, L) - 1], jnp.ones((L,), jnp.int32))

    r = run_sc(gen, body, [], [((L,), np.int32)])
    assert r.kinds() == ["out-of-bounds"], r.findings
    assert "store_scatter lane 0" in r.findings[0].message
    np.testing.assert_array_equal(r.outs[0], np.r_[np.ones(L - 1, np.int32), 0])


@gens
@pytest.mark.parametrize("which", MASKS)
def test_addupdate_scatter_duplicates_accumulate(gen, which):
    L = GENS[gen]
    x = (np.arange(L) * 3 - 10).astype(np.int32)  # negatives
    idx = (np.arange(L) % 3).astype(np.int32)
    mask = masks(L)[which]

    def body(x_v, i_v, m_v, o_v):
        o_v[...] = jnp.ones((L,), jnp.int32)
        plsc.addupdate_scatter(o_v, [i_v[...]], x_v[...], mask=m_v[...] != 0)

    r = run_sc(gen, body, [x, idx, mask.astype(np.int32)], [((L,), np.int32)])
    want = np.ones(L, np.int32)
    np.add.at(want, idx[mask], x[mask])
    np.testing.assert_array_equal(r.outs[0], want)
    assert r.findings == []


@gens
def test_addupdate_scatter_into_never_written_memory_is_an_uninitialized_read(gen):
    L = GENS[gen]

    def body(o_v, s_v):
        plsc.addupdate_scatter(s_v, [jax.lax.iota(jnp.int32, L)], jnp.ones((L,), jnp.int32))
        o_v[...] = s_v[...]

    r = run_sc(gen, body, [], [((L,), np.int32)], [pltpu.VMEM((L,), jnp.int32)])
    assert r.kinds() == ["uninitialized"], r.findings
    assert r.findings[0].buffer == "refs[2]"  # s_v


# -- load_expanded / store_compressed / addupdate ----------------------------------------------

@gens
@pytest.mark.parametrize("which", MASKS)
def test_load_expanded_reads_only_the_first_popcount_elements(gen, which):
    L = GENS[gen]
    mask = masks(L)[which]
    n = int(mask.sum())
    x = (np.arange(L) - 3).astype(np.int32)

    def body(x_v, m_v, o_v, s_v):
        # only s_v[0:n] is written: reading more would be an uninitialized read
        m = m_v[...] != 0
        plsc.store_compressed(s_v.at[...], x_v[...], mask=m)
        o_v[...] = jnp.where(m, plsc.load_expanded(s_v.at[...], mask=m), -1)

    r = run_sc(gen, body, [x, mask.astype(np.int32)], [((L,), np.int32)],
               [pltpu.VMEM((L,), jnp.int32)])
    # expand(compress(x)) == x on the active lanes
    np.testing.assert_array_equal(r.outs[0], np.where(mask, x, -1))
    assert r.findings == [], [f.message for f in r.findings]
    assert n == mask.sum()


@gens
def test_load_expanded_places_the_ith_element_at_the_ith_active_lane(gen):
    L = GENS[gen]
    x = (np.arange(L) * 10 - 40).astype(np.float32)
    mask = np.arange(L) % 3 == 0

    def body(x_v, m_v, o_v):
        m = m_v[...] != 0
        o_v[...] = jnp.where(m, plsc.load_expanded(x_v.at[...], mask=m), 0.0)

    r = run_sc(gen, body, [x, mask.astype(np.int32)], [((L,), np.float32)])
    want = np.zeros(L, np.float32)
    want[mask] = x[: mask.sum()]
    np.testing.assert_array_equal(r.outs[0], want)
    assert r.findings == []


@gens
def test_load_expanded_inactive_lanes_reaching_an_output_are_reported(gen):
    L = GENS[gen]
    x = np.arange(L, dtype=np.float32)

    def body(x_v, o_v):
        o_v[...] = plsc.load_expanded(x_v.at[...], mask=x_v[...] < 2)

    r = run_sc(gen, body, [x], [((L,), np.float32)])
    assert r.kinds() == ["uninitialized"], r.findings
    assert r.findings[0].details["output_range"] == [[2, L]]


@gens
@pytest.mark.parametrize("which", MASKS)
def test_store_compressed_writes_ref_0_to_popcount_and_nothing_else(gen, which):
    L = GENS[gen]
    mask = masks(L)[which]
    x = (np.arange(L) - 5).astype(np.int32)

    def body(x_v, m_v, o_v):
        o_v[...] = jnp.full((L,), 42, jnp.int32)  # survives past popcount
        plsc.store_compressed(o_v.at[...], x_v[...], mask=m_v[...] != 0)

    r = run_sc(gen, body, [x, mask.astype(np.int32)], [((L,), np.int32)])
    want = np.full(L, 42, np.int32)
    want[: mask.sum()] = x[mask]
    np.testing.assert_array_equal(r.outs[0], want)
    assert r.findings == []


@gens
def test_addupdate_adds_and_reads_the_ref(gen):
    L = GENS[gen]
    x = (np.arange(2 * L) - L).astype(np.int32)

    def body(x_v, o_v):
        o_v[...] = x_v[...]
        plsc.addupdate(o_v.at[pl.ds(L, L)], x_v[pl.ds(0, L)])

    r = run_sc(gen, body, [x], [((2 * L,), np.int32)])
    np.testing.assert_array_equal(r.outs[0], np.r_[x[:L], x[L:] + x[:L]])
    assert r.findings == []


@gens
def test_addupdate_compressed(gen):
    L = GENS[gen]
    x = (np.arange(L) + 1).astype(np.int32)
    mask = np.arange(L) % 2 == 0

    def body(x_v, m_v, o_v):
        o_v[...] = jnp.full((L,), 100, jnp.int32)
        plsc.addupdate_compressed(o_v.at[...], x_v[...], mask=m_v[...] != 0)

    r = run_sc(gen, body, [x, mask.astype(np.int32)], [((L,), np.int32)])
    want = np.full(L, 100, np.int32)
    want[: mask.sum()] += x[mask]
    np.testing.assert_array_equal(r.outs[0], want)


@gens
def test_addupdate_of_never_written_memory_is_an_uninitialized_read(gen):
    L = GENS[gen]

    def body(o_v, s_v):
        plsc.addupdate(s_v.at[...], jnp.ones((L,), jnp.int32))
        o_v[...] = s_v[...]

    r = run_sc(gen, body, [], [((L,), np.int32)], [pltpu.VMEM((L,), jnp.int32)])
    assert r.kinds() == ["uninitialized"], r.findings


# -- scans ------------------------------------------------------------------------------------

@gens
@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_cumsum_cummax_cummin(gen, which, dtype):
    L = GENS[gen]
    x = np.random.default_rng(L).integers(-50, 50, L).astype(dtype)
    mask = masks(L)[which]

    def body(x_v, m_v, s_v, mx_v, mn_v):
        v, m = x_v[...], m_v[...] != 0
        s_v[...] = plsc.cumsum(v, mask=m)
        mx_v[...] = plsc.cummax(v, mask=m)
        mn_v[...] = sc_primitives.cummin(v, mask=m)  # not exported by plsc (jax 0.10.2)

    r = run_sc(gen, body, [x, mask.astype(np.int32)], [((L,), dtype)] * 3)
    np.testing.assert_array_equal(r.outs[0], np.cumsum(np.where(mask, x, 0)).astype(dtype))
    seen = np.cumsum(mask) > 0
    for out, acc in ((r.outs[1], np.maximum), (r.outs[2], np.minimum)):
        big = np.where(mask, x, np.iinfo(np.int32).min if acc is np.maximum
                       else np.iinfo(np.int32).max).astype(np.float64)
        want = np.where(seen, acc.accumulate(big), x).astype(dtype)
        np.testing.assert_array_equal(out, want)
    assert r.findings == []


def test_cumsum_int32_wraps_and_cummax_uint32_is_unsigned():
    x = np.array([2**31 - 1, 1, 5, -3], np.int32)
    np.testing.assert_array_equal(sc_values.masked_cumsum(x, np.ones(4, bool)),
                                  np.array([2**31 - 1, -2**31, -2**31 + 5, -2**31 + 2],
                                           np.int32))
    u = np.array([1, 2**32 - 1, 3], np.uint32)
    np.testing.assert_array_equal(sc_values.masked_cummax(u, np.ones(3, bool)),
                                  np.array([1, 2**32 - 1, 2**32 - 1], np.uint32))
    # the JAX test's reference: cummax(x, mask=x%2==1) over a shuffled arange
    x = np.random.default_rng(0).permutation(16).astype(np.int32)
    m = x % 2 == 1
    row, col = np.arange(16)[:, None], np.arange(16)[None, :]
    want = np.where(np.cumsum(m) > 0, (x * m * (col <= row)).max(axis=1), x)
    np.testing.assert_array_equal(sc_values.masked_cummax(x, m), want)


@gens
def test_jnp_cumsum_in_a_subcore_kernel(gen):
    L = GENS[gen]
    x = (np.arange(L) - 4).astype(np.int32)

    def body(x_v, o_v):
        o_v[...] = jnp.cumsum(x_v[...])

    r = run_sc(gen, body, [x], [((L,), np.int32)])
    np.testing.assert_array_equal(r.outs[0], np.cumsum(x))


# -- sort_key_val --------------------------------------------------------------------------

def _sort_reference(keys, values, mask, descending):
    """JAX's test's reference: stable argsort of (-)keys, masked-off keys last."""
    k = keys.astype(np.int64) if keys.dtype.kind in "iu" else keys.astype(np.float64)
    if descending:
        k = -k
    if mask is not None:
        k = np.where(mask, k, k.max() + 1)
    order = np.argsort(k, kind="stable")
    return keys[order], values[order]


@gens
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("which", [None, *MASKS])
@pytest.mark.parametrize("kdtype", [np.int32, np.uint32, np.float32])
def test_sort_key_val_stable_ties_negatives_masks(gen, descending, which, kdtype):
    L = GENS[gen]
    rng = np.random.default_rng(L + descending)
    keys = (np.arange(L) - L // 2)
    rng.shuffle(keys)
    keys[3] = keys[1]  # a tie
    keys[5] = keys[1]  # three of them
    keys = keys.astype(kdtype)
    values = rng.permutation(L).astype(np.int32)
    mask = None if which is None else masks(L)[which]
    n_out = 2 if mask is None else 3

    def body(k_v, v_v, m_v, ko, vo, *mo):
        m = None if mask is None else m_v[...] != 0
        outs = plsc.sort_key_val(k_v[...], v_v[...], mask=m, descending=descending)
        ko[...], vo[...] = outs[0], outs[1]
        if mo:
            mo[0][...] = outs[2].astype(jnp.int32)

    m_in = (np.ones(L, bool) if mask is None else mask).astype(np.int32)
    outs = [((L,), kdtype), ((L,), np.int32)] + ([((L,), np.int32)] if n_out == 3 else [])
    r = run_sc(gen, body, [keys, values, m_in], outs)
    want_k, want_v = _sort_reference(keys, values, mask, descending)
    np.testing.assert_array_equal(r.outs[0], want_k)
    np.testing.assert_array_equal(r.outs[1], want_v)
    if mask is not None:
        np.testing.assert_array_equal(r.outs[2], np.arange(L) < mask.sum())
    assert r.findings == []


# -- scan_count -------------------------------------------------------------------------------

@gens
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_scan_count_all_lanes_jax_reference(gen, dtype):
    L = GENS[gen]
    x = np.random.default_rng(L).integers(-3, 3, L).astype(dtype)  # duplicates, negatives

    def body(x_v, c_v, l_v):
        counts, last = plsc.scan_count(x_v[...])
        c_v[...] = counts
        l_v[...] = last.astype(jnp.int32)

    r = run_sc(gen, body, [x], [((L,), np.int32)] * 2)
    c = collections.Counter()
    counts = []
    for item in x:
        c[float(item)] += 1
        counts.append(c[float(item)])
    last = []
    for item in x:
        c[float(item)] -= 1
        last.append(c[float(item)] == 0)
    np.testing.assert_array_equal(r.outs[0], counts)
    np.testing.assert_array_equal(r.outs[1], last)
    assert r.findings == []


@gens
@pytest.mark.parametrize("which", MASKS)
def test_scan_count_masked_counts_active_lanes_only(gen, which):
    L = GENS[gen]
    x = (np.arange(L) % 3).astype(np.int32)
    mask = masks(L)[which]

    def body(x_v, m_v, c_v, l_v):
        m = m_v[...] != 0
        counts, last = plsc.scan_count(x_v[...], m)
        c_v[...] = jnp.where(m, counts, 0)  # inactive lanes: undefined count
        l_v[...] = last.astype(jnp.int32)

    r = run_sc(gen, body, [x, mask.astype(np.int32)], [((L,), np.int32)] * 2)
    want_c = np.zeros(L, np.int32)
    want_l = np.zeros(L, bool)
    for i in range(L):
        if mask[i]:
            same = mask & (x == x[i])
            want_c[i] = same[: i + 1].sum()
            want_l[i] = not same[i + 1:].any()
    np.testing.assert_array_equal(r.outs[0], want_c)
    np.testing.assert_array_equal(r.outs[1], want_l)
    assert r.findings == []


@gens
def test_scan_count_masked_off_counts_reaching_an_output_are_reported(gen):
    L = GENS[gen]
    x = (np.arange(L) % 3).astype(np.int32)

    def body(x_v, c_v):
        v = x_v[...]
        c_v[...], _ = plsc.scan_count(v, v > 0)  # lanes holding 0 are masked off

    r = run_sc(gen, body, [x], [((L,), np.int32)])
    assert r.kinds() == ["uninitialized"], r.findings
    f = r.findings[0]
    assert f.buffer == "masked-off lanes of scan_count" and f.index_range is None
    assert f.details["output_range"] == [[0, L - (L - 1) % 3]]


# -- mask reductions -----------------------------------------------------------------------

@gens
@pytest.mark.parametrize("which", MASKS)
def test_population_count_and_ffs(gen, which):
    L = GENS[gen]
    mask = masks(L)[which]

    def body(m_v, p_v, f_v):
        m = m_v[...] != 0
        p_v[...] = plsc.all_reduce_population_count(m)
        f_v[...] = plsc.all_reduce_ffs(m)

    r = run_sc(gen, body, [mask.astype(np.int32)], [((L,), np.int32)] * 2)
    np.testing.assert_array_equal(r.outs[0], np.full(L, mask.sum()))
    first = int(np.argmax(mask)) if mask.any() else L
    np.testing.assert_array_equal(r.outs[1], np.full(L, first))


def test_mask_reductions_with_reduce():
    m = np.array([0, 0, 1, 0, 1, 1, 0, 0], bool)
    np.testing.assert_array_equal(sc_values.population_count(m, 2), [3] * 4)
    np.testing.assert_array_equal(sc_values.first_set(m, 4), [2] * 2)
    np.testing.assert_array_equal(sc_values.first_set(np.zeros(8, bool), 1), [8] * 8)


# -- pack / unpack / bitcast -------------------------------------------------------------------

@gens
@pytest.mark.parametrize("fmt", ["INTERLEAVED", "COMPRESSED"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_pack_unpack_round_trip_jax_reference(gen, fmt, dtype):
    L = GENS[gen]
    a = np.arange(L, dtype=dtype)
    b = -a
    f = getattr(plsc.PackFormat, fmt)

    def body(a_v, b_v, oa, ob):
        ua, ub = plsc.unpack(plsc.pack(a_v[...], b_v[...], format=f), format=f)
        oa[...], ob[...] = ua, ub

    r = run_sc(gen, body, [a, b], [((L,), dtype)] * 2)
    np.testing.assert_array_equal(r.outs[0], a)
    np.testing.assert_array_equal(r.outs[1], b)


@gens
def test_pack_layout_and_narrowing_as_assumed(gen):
    """DESIGN §6 question 4, as documented: INTERLEAVED [a0, b0, a1, b1, ...]; COMPRESSED
    a's then b's in the (n, 2) result's row-major order; int32 -> int16 keeps the low 16
    bits; f32 -> bf16 rounds to nearest even."""
    L = GENS[gen]
    a = (np.arange(L) + 70000).astype(np.int32)  # past int16: wraps
    b = -(np.arange(L) + 1).astype(np.int32)

    def body(a_v, b_v, oi, oc):
        oi[...] = plsc.bitcast(plsc.pack(a_v[...], b_v[...],
                                         format=plsc.PackFormat.INTERLEAVED), jnp.int32)
        packed = plsc.pack(a_v[...], b_v[...], format=plsc.PackFormat.COMPRESSED)
        lo, hi = plsc.unpack(packed, format=plsc.PackFormat.COMPRESSED)
        oc[...] = lo + hi

    r = run_sc(gen, body, [a, b], [((L,), np.int32)] * 2)
    inter = np.stack([a.astype(np.int16), b.astype(np.int16)], -1).reshape(-1)
    np.testing.assert_array_equal(r.outs[0], inter.view(np.int32))
    np.testing.assert_array_equal(r.outs[1], a.astype(np.int16).astype(np.int32) + b)
    packed = sc_values.pack(a, b, "compressed", np.dtype(np.int16), (L, 2))
    np.testing.assert_array_equal(packed.reshape(-1), np.r_[a.astype(np.int16),
                                                            b.astype(np.int16)])
    # f32 -> bf16: round to nearest even (1 + 2**-8 is halfway: to 1; 1 + 3 * 2**-8: up)
    f = np.array([1 + 2**-8, 1 + 3 * 2**-8], np.float32)
    got = sc_values.pack(f, f, "interleaved", np.dtype(ml_dtypes.bfloat16), (4,))
    np.testing.assert_array_equal(got.astype(np.float32), [1, 1, 1 + 2**-6, 1 + 2**-6])


@gens
def test_bitcast_same_rank_last_dim_scaled(gen):
    L = GENS[gen]
    x = (np.arange(L) - 3.5).astype(np.float32)

    def body(x_v, o_v, h_v):
        o_v[...] = plsc.bitcast(x_v[...], jnp.int32)
        h_v[...] = plsc.bitcast(plsc.bitcast(x_v[...], jnp.int16), jnp.float32)

    r = run_sc(gen, body, [x], [((L,), np.int32), ((L,), np.float32)])
    np.testing.assert_array_equal(r.outs[0], x.view(np.int32))
    np.testing.assert_array_equal(r.outs[1], x)
    assert sc_values.bitcast(x, np.int16).shape == (2 * L,)
    assert sc_values.bitcast(x.reshape(2, -1), np.int16).shape == (2, L)


# -- parallel_loop values ----------------------------------------------------------------------

class _Recorder:
    def __init__(self):
        self.events = []

    def loop_started(self, ctx, eqn):
        self.events.append("start")

    def iteration_started(self, ctx, eqn, index):
        self.events.append(("in", index))

    def iteration_ended(self, ctx, eqn, index):
        self.events.append(("out", index))

    def loop_ended(self, ctx, eqn):
        self.events.append("end")


@gens
def test_parallel_loop_runs_each_index_with_the_carry_and_calls_the_hooks(gen):
    L = GENS[gen]
    x = (np.arange(4 * L) - 9).astype(np.int32)
    recorder = _Recorder()
    sparsecore.PARALLEL_LOOP_HOOKS.append(recorder)
    try:
        def body(x_v, o_v, t_v):
            @plsc.parallel_loop(0, 4 * L, step=L, carry=(jnp.int32(0), jnp.int32(1)))
            def total(i, carry):
                s, k = carry
                o_v[pl.ds(i, L)] = x_v[pl.ds(i, L)] * k
                return s + i, k + 1
            t_v[...] = jnp.full((L,), total[0] * 100 + total[1], jnp.int32)

        r = run_sc(gen, body, [x], [((4 * L,), np.int32), ((L,), np.int32)])
    finally:
        sparsecore.PARALLEL_LOOP_HOOKS.remove(recorder)
    np.testing.assert_array_equal(r.outs[0], x * np.repeat(np.arange(1, 5), L))
    np.testing.assert_array_equal(r.outs[1], np.full(L, (0 + 1 + 2 + 3) * L * 100 + 5))
    steps = [0, L, 2 * L, 3 * L]
    assert recorder.events == ["start", *[e for i in steps for e in (("in", i), ("out", i))],
                               "end"]
    assert r.findings == []


@gens
def test_parallel_loop_without_carry_and_empty_range(gen):
    L = GENS[gen]

    def body(o_v):
        o_v[...] = jnp.zeros((2 * L,), jnp.int32)

        @plsc.parallel_loop(0, 2 * L)
        def _(i):
            o_v[pl.ds(i, 1)] = jnp.full((1,), i, jnp.int32)

        @plsc.parallel_loop(5, 5)
        def _(i):
            o_v[pl.ds(0, 1)] = jnp.full((1,), -1, jnp.int32)

    r = run_sc(gen, body, [], [((2 * L,), np.int32)])
    np.testing.assert_array_equal(r.outs[0], np.arange(2 * L))


# -- transformed refs ------------------------------------------------------------------------

@gens
def test_gather_and_scatter_through_a_sliced_ref_index_within_the_slice(gen):
    L = GENS[gen]
    x = (np.arange(3 * L) - L).astype(np.int32)
    idx = ((np.arange(L) * 3) % L).astype(np.int32)

    def body(x_v, i_v, o_v):
        i = i_v[...]
        o_v[...] = jnp.zeros((3 * L,), jnp.int32)
        g = plsc.load_gather(x_v.at[pl.ds(L, L)], [i])
        plsc.store_scatter(o_v.at[pl.ds(2 * L, L)], [i], g)

    r = run_sc(gen, body, [x, idx], [((3 * L,), np.int32)])
    want = np.zeros(3 * L, np.int32)
    want[2 * L + idx] = x[L + idx]
    np.testing.assert_array_equal(r.outs[0], want)
    assert r.findings == []


@gens
def test_gather_past_a_sliced_ref_is_out_of_bounds_of_the_slice(gen):
    L = GENS[gen]
    x = np.arange(3 * L, dtype=np.int32)

    def body(x_v, o_v):
        o_v[...] = plsc.load_gather(x_v.at[pl.ds(L, L)], [jax.lax.iota(jnp.int32, L) + 1])

    r = run_sc(gen, body, [x], [((L,), np.int32)])
    assert r.kinds() == ["out-of-bounds"], r.findings
    assert f"load_gather lane {L - 1}" in r.findings[0].message


@gens
def test_lax_sort_rev_iota_reduce_in_a_subcore_kernel(gen):
    """Plain lax ops with SparseCore lowerings (sort, rev, iota, reduce_*): evaluated as any
    pure equation is; here to show they need no rule of their own."""
    L = GENS[gen]
    x = np.random.default_rng(L).permutation(L).astype(np.int32) - 3

    def body(x_v, s_v, r_v, i_v, m_v):
        v = x_v[...]
        s_v[...] = jnp.sort(v, descending=True)
        r_v[...] = jax.lax.rev(v, (0,))
        i_v[...] = jax.lax.iota(jnp.int32, L)
        m_v[...] = jnp.full((L,), jnp.max(v) * 100 + jnp.sum(v), jnp.int32)

    r = run_sc(gen, body, [x], [((L,), np.int32)] * 4)
    np.testing.assert_array_equal(r.outs[0], np.sort(x)[::-1])
    np.testing.assert_array_equal(r.outs[1], x[::-1])
    np.testing.assert_array_equal(r.outs[2], np.arange(L))
    np.testing.assert_array_equal(r.outs[3], np.full(L, x.max() * 100 + x.sum()))
