"""The values of the SparseCore vector ops (`jax.experimental.pallas.tpu_sc`), as pure numpy
functions of their operands: no engine state, so each is tested alone against a numpy
reference at its edges (tests/engine/rules/test_sparsecore_ops.py). The memory-touching ops
(gathers, scatters, compressed loads and stores) are in rules/sparsecore.py: they need the
engine's memory model; the lane arithmetic they share (which lane reads which element) is
here.

"Active" lane: mask True (every lane when there is no mask). A lane the hardware leaves
undefined gets `fill` (the value never-written memory holds under --uninit), so a use of it
differs between the two fills and is reported like a read of never-written memory.
Semantics come from jax/_src/pallas/mosaic/sc_primitives.py (docstrings, abstract evals and
lowerings) and JAX's SparseCore tests; what they leave open is marked ASSUMED.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def active(mask: object, n: int) -> np.ndarray:
    """The mask as a bool array of n lanes (None: all lanes active)."""
    if mask is None:
        return np.ones(n, bool)
    return np.asarray(mask, dtype=bool).reshape(n)


# -- compressed / expanded lanes (load_expanded, store_compressed) --------------------------

def expand(values: np.ndarray, mask: np.ndarray, fill: np.ndarray | float) -> np.ndarray:
    """`load_expanded`: the i-th active lane gets values[i]; inactive lanes are undefined
    (fill). `values` holds exactly popcount(mask) elements."""
    mask = np.asarray(mask, bool)
    out = np.full(mask.shape, fill, dtype=np.asarray(values).dtype)
    out[mask] = np.asarray(values).reshape(-1)[: int(mask.sum())]
    return out


def compress(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`store_compressed`: the active lanes of x, in lane order (written to ref[0:n])."""
    active: np.ndarray = np.asarray(x)[np.asarray(mask, bool)]
    return active


# -- scans ------------------------------------------------------------------------------------

def masked_cumsum(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Running sum of the active elements (inactive ones add 0), in x's dtype: int32 wraps
    as the hardware's adder does; floats are summed lane after lane (ASSUMED sequential)."""
    x = np.asarray(x)
    terms = np.where(np.asarray(mask, bool), x, np.zeros((), x.dtype)).astype(x.dtype)
    with np.errstate(over="ignore"):
        return np.cumsum(terms, dtype=x.dtype)


def _masked_running(x: np.ndarray, mask: np.ndarray,
                    pick: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """Running max/min over the active elements; lanes before the first active one pass x
    through (sc_primitives.cummax's docstring). Compared in x's dtype: int32 signed
    (the lowering flips the sign bit around an unsigned scan), uint32 unsigned."""
    x = np.asarray(x)
    mask = np.asarray(mask, bool)
    out = x.copy()
    best = None
    for i in range(x.shape[0]):
        if mask[i]:
            best = x[i] if best is None else pick(best, x[i])
        if best is not None:
            out[i] = best
    return out


def masked_cummax(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return _masked_running(x, mask, np.maximum)


def masked_cummin(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return _masked_running(x, mask, np.minimum)


def cumsum(x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """`jnp.cumsum` / lax.cumsum_p inside a SparseCore kernel (axis 0 of a vector)."""
    x = np.asarray(x)
    with np.errstate(over="ignore"):
        if reverse:
            return np.flip(np.cumsum(np.flip(x, axis), axis=axis, dtype=x.dtype), axis)
        return np.cumsum(x, axis=axis, dtype=x.dtype)


# -- sort, scan_count -------------------------------------------------------------------------

def sort_key_val(keys: np.ndarray, values: np.ndarray, mask: np.ndarray | None,
                 descending: bool) -> list[np.ndarray]:
    """`sort_key_val`: a STABLE sort by key (ties keep lane order, descending too: the
    order of -key, as JAX's test builds its reference); masked-off elements go after every
    active one, in lane order; with a mask, a third output: the first popcount(mask) lanes
    are True. Float keys: NaN sorts as numpy's (last ascending) -- ASSUMED."""
    keys, values = np.asarray(keys), np.asarray(values)
    on = active(mask, keys.shape[0])
    order_key = keys.astype(np.float64) if keys.dtype.kind == "f" else keys.astype(np.int64)
    if descending:
        order_key = -order_key
    lanes = np.arange(keys.shape[0])
    act, rest = lanes[on], lanes[~on]
    order = np.concatenate([act[np.argsort(order_key[act], kind="stable")], rest])
    outs = [keys[order], values[order]]
    if mask is not None:
        outs.append(lanes < int(on.sum()))
    return outs


def scan_count(x: np.ndarray, mask: np.ndarray, fill: np.ndarray | float) -> list[np.ndarray]:
    """`scan_count`: counts[i] = how many active j <= i hold x[i] (1-based); last[i] = lane i
    is active and no active j > i holds x[i] (JAX's test, all lanes active). Inactive
    lanes: count undefined (fill) and last False -- ASSUMED. Equality as numpy's ==
    (float -0.0 == 0.0; NaN equals nothing) -- ASSUMED."""
    x = np.asarray(x)
    on = np.asarray(mask, bool)
    n = x.shape[0]
    counts = np.full(n, fill, dtype=np.int32)
    last = np.zeros(n, bool)
    for i in range(n):
        if not on[i]:
            continue
        same = on & (x == x[i])
        counts[i] = int(same[: i + 1].sum())
        last[i] = not same[i + 1:].any()
    return [counts, last]


# -- mask reductions --------------------------------------------------------------------------

def population_count(mask: np.ndarray, reduce: int) -> np.ndarray:
    """`all_reduce_population_count`: every output lane holds the number of True lanes."""
    mask = np.asarray(mask, bool)
    return np.full(mask.shape[0] // reduce, int(mask.sum()), dtype=np.int32)


def first_set(mask: np.ndarray, reduce: int) -> np.ndarray:
    """`all_reduce_ffs`: every output lane holds the first True lane, or the lane count
    when none is."""
    mask = np.asarray(mask, bool)
    hits = np.nonzero(mask)[0]
    first = int(hits[0]) if hits.size else mask.shape[0]
    return np.full(mask.shape[0] // reduce, first, dtype=np.int32)


# -- pack / unpack / bitcast ------------------------------------------------------------------

INTERLEAVED, COMPRESSED = "interleaved", "compressed"


def _narrow(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """32 -> 16 bits: floats round to nearest even (ml_dtypes' cast); integers keep their
    low 16 bits (Mosaic: "integer-to-integer conversions truncate the high bits")."""
    x = np.asarray(x)
    if np.dtype(dtype).kind in "iu":
        if x.dtype.kind == "f":  # Mosaic: "Float to integer packing rounds to nearest even"
            x = np.rint(x).astype(np.int64)
        return x.astype(dtype)  # numpy's integer cast keeps the low bits
    return x.astype(dtype)


def _widen(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """16 -> 32 bits: exact (integers sign- or zero-extend by their own signedness)."""
    return np.asarray(x).astype(dtype)


def pack(a: np.ndarray, b: np.ndarray, fmt: str, dtype: np.dtype,
         shape: tuple[int, ...]) -> np.ndarray:
    """`pack(a, b)`: both narrowed to `dtype`; INTERLEAVED: [a0, b0, a1, b1, ...];
    COMPRESSED: a's elements then b's, in the row-major order of the (n, 2) result (Mosaic's
    "concatenates the rows of the sources"; the source comment's [[a0, a1], [b0, b1]] read
    flat) -- ASSUMED, only the round trip is tested by JAX."""
    a, b = _narrow(a, dtype), _narrow(b, dtype)
    flat = (np.stack([a, b], axis=-1).reshape(-1) if fmt == INTERLEAVED
            else np.concatenate([a.reshape(-1), b.reshape(-1)]))
    return flat.reshape(shape)


def unpack(ab: np.ndarray, fmt: str, dtype: np.dtype) -> list[np.ndarray]:
    """The inverse of `pack`: two arrays of half ab's size, widened to `dtype`."""
    flat = np.asarray(ab).reshape(-1)
    half = flat.shape[0] // 2
    a, b = (flat[0::2], flat[1::2]) if fmt == INTERLEAVED else (flat[:half], flat[half:])
    return [_widen(a, dtype), _widen(b, dtype)]


def bitcast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`plsc.bitcast`: the bits reinterpreted along the last axis (little-endian), whose
    length scales by old bits / new bits; the rank stays."""
    x = np.ascontiguousarray(np.asarray(x))
    dtype = np.dtype(dtype)
    if x.ndim == 0:
        return x.view(dtype).reshape(())
    return x.view(dtype).reshape(*x.shape[:-1], -1)
