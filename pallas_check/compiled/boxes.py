"""Box arithmetic while tracing: start indices that are Python ints where they are
static (so that a static box is checked once, at trace time) and traced int32 scalars
where they are not; the tests of a box against its buffer and against the DMA table."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

# A start index while tracing: a Python int (static) or a traced int32 scalar.
Index = Any
# The largest rank a buffer may have (boxes in the DMA table are padded to it).
MAX_RANK = 6


# The arithmetic on traced indices and flags is `lax`'s, not `jax.numpy`'s operators: the
# same operations, but each `jax.numpy` operator on a tracer is a jitted function of its
# own (a trace-cache lookup, then its jaxpr inlined), and a call's build makes thousands
# (paged attention's build: in 60 % of the time, benchmarks/README.md).


def plus(a: Index, b: Index) -> Index:
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return int(a) + int(b)
    return lax.add(i32(a), i32(b))


def i32(x: Index) -> jax.Array:
    """`x` as an int32 scalar of the trace (a traced int32 as it is)."""
    if isinstance(x, jax.Array) and x.dtype == np.int32:
        return x
    return jnp.asarray(x, jnp.int32)


def times(a: Index, k: int) -> Index:
    return int(a) * k if isinstance(a, (int, np.integer)) else lax.mul(i32(a), np.int32(k))


def outside(start: Index, size: int, extent: int) -> Any:
    """Whether [start, start + size) leaves [0, extent) (static where the start is)."""
    if isinstance(start, (int, np.integer)):
        return bool(start < 0 or start + size > extent)
    s = i32(start)
    return lax.bitwise_or(lax.lt(s, np.int32(0)),
                          lax.gt(lax.add(s, np.int32(size)), np.int32(extent)))


def either(a: Any, b: Any) -> Any:
    """`a | b` of two flags or verdicts (traced arrays of one shape and type, or Python
    values)."""
    if (isinstance(a, jax.Array) and isinstance(b, jax.Array) and a.shape == b.shape
            and a.dtype == b.dtype):
        return lax.bitwise_or(a, b)
    return a | b


def any_of(conditions: Any) -> Any:
    found: Any = False
    for c in conditions:
        if isinstance(c, (bool, np.bool_)):
            if c:
                return True
            continue
        found = c if found is False else either(found, c)
    return found


def boxes_meet(a_starts: Sequence[Index], a_sizes: Sequence[int],
               b_starts: Sequence[Index], b_sizes: Sequence[int]) -> Any:
    """Whether two boxes of one buffer meet (a Python bool where every start is static,
    else a traced bool)."""
    found: Any = True
    for a, n, b, m in zip(a_starts, a_sizes, b_starts, b_sizes):
        if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
            if not (a < b + m and b < a + n):
                return False
            continue
        a32, b32 = i32(a), i32(b)
        here = lax.bitwise_and(lax.lt(a32, lax.add(b32, np.int32(m))),
                               lax.lt(b32, lax.add(a32, np.int32(n))))
        found = here if found is True else lax.bitwise_and(found, here)
    return found


def take(array: jax.Array, starts: Sequence[Index], sizes: Sequence[int]) -> jax.Array:
    """The box of `array` at `starts`, clamped into the array as XLA clamps (a box that
    leaves it is flagged out-of-bounds where it is made, so its run does not stand: a
    negative start is not counted from the end, which spares each traced start the
    trace's test and select). The whole array is the array itself and a static box a
    static slice: the compiled tier runs without XLA's algebraic simplifier
    (engine/jaxpr/program.py), which is what would otherwise drop a whole-array dynamic
    slice (flash attention: a copy of its block at each load)."""
    sizes = tuple(int(n) for n in sizes)
    if sizes == tuple(array.shape):
        return array
    if all(isinstance(s, (int, np.integer)) for s in starts):
        at = [min(max(int(s), 0), n - m) for s, n, m in zip(starts, array.shape, sizes)]
        return lax.slice(array, at, [a + m for a, m in zip(at, sizes)])
    return lax.dynamic_slice(array, [i32(s) for s in starts], sizes,
                             allow_negative_indices=False)


def put(array: jax.Array, value: jax.Array, starts: Sequence[Index]) -> jax.Array:
    """`array` with the box at `starts` replaced by `value` (of the box's shape), clamped
    as `take` clamps; a box that is the whole array is `value` itself (see `take`)."""
    if tuple(value.shape) == tuple(array.shape):
        return value
    return lax.dynamic_update_slice(array, value, [i32(s) for s in starts],
                                    allow_negative_indices=False)


def at(array: jax.Array, slot: jax.Array) -> jax.Array:
    """`array[slot]` along its first axis, for a traced slot known to lie in it (a table
    slot): one dynamic slice, with no test for a negative index."""
    starts = [i32(slot)] + [np.int32(0)] * (array.ndim - 1)
    row = lax.dynamic_slice(array, starts, (1, *array.shape[1:]),
                            allow_negative_indices=False)
    return lax.squeeze(row, (0,))


def all_set(flags: jax.Array) -> jax.Array:
    """Whether every element of a bool array holds (True for none). As the minimum of its
    bytes: XLA's CPU backend runs a bool and-reduction of a block element by element
    (a (128, 128) shadow: about 5 us), a uint8 min vectorized (about 1 us)."""
    if flags.size == 0:
        return jnp.bool_(True)
    return jnp.min(flags.astype(jnp.uint8)) > 0


def any_set(flags: jax.Array) -> jax.Array:
    """Whether some element of a bool array holds, as `all_set` reduces (vectorized)."""
    if flags.size == 0:
        return jnp.bool_(False)
    return jnp.max(flags.astype(jnp.uint8)) > 0


def padded(values: Sequence[Index], pad: int) -> jax.Array:
    values = list(values) + [pad] * (MAX_RANK - len(values))
    return jnp.stack([i32(v) for v in values])


def meets(starts: jax.Array, sizes: jax.Array, start: jax.Array, size: jax.Array
           ) -> jax.Array:
    """Per table slot, whether its box meets the box (start, size) (padded dims meet)."""
    return jnp.all((starts < start + size) & (start < starts + sizes), axis=-1)
