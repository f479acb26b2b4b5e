"""Typed PRNG keys (`key<pl>`, `key<_pl_stateful>`, a threefry key) as pallas-check holds
them: a key array is a numpy array of the key's *shape*, whose elements are a structured
dtype of the key's words (uint32, `impl.key_shape` of them). Buffers, loads and stores
then index a key ref as any other; the PRNG rules (engine/rules/random.py) read the words.

XLA holds a key array as its physical words, `uint32[*shape, *key_shape]`: what a call's
host callback receives and returns (`physical_aval`, `to_logical`, `to_physical`).

The Pallas TPU implementations (JAX's `jax/_src/pallas/mosaic/random.py`):
`pallas_tpu` (`pltpu.to_pallas_key`: two words; `random_bits` seeds the core's hardware
PRNG with them and draws, `fold_in` mixes data in by one threefry round), and
`_pallas_internal_stateful` (`pltpu.stateful_*`: a placeholder key; `random_bits` draws
from the core's PRNG as it stands). Keys of any other implementation are evaluated by JAX.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax._src.pallas.mosaic import random as _pl_random
from jax._src.random import prng as _prng

from pallas_check.jaxbridge.types import AbstractValue, ShapedArray

PALLAS_TPU = "pallas_tpu"
STATEFUL = "_pallas_internal_stateful"


def is_key_dtype(dtype: object) -> bool:
    """Whether `dtype` is a typed PRNG key's (`key<...>`)."""
    return isinstance(dtype, _prng.KeyTy)


def is_key_aval(aval: object) -> bool:
    """Whether `aval` (a value's, or a ref's) holds typed PRNG keys."""
    return is_key_dtype(getattr(aval, "dtype", None))


def _impl(dtype: object) -> Any:  # JAX's PRNGImpl
    return dtype._impl  # type: ignore[attr-defined]


def impl_name(dtype: object) -> str:
    """The implementation's name: `PALLAS_TPU`, `STATEFUL`, "threefry2x32", ..."""
    return str(_impl(dtype).name)


def key_shape(dtype: object) -> tuple[int, ...]:
    """The shape of one key's words."""
    return tuple(int(d) for d in _impl(dtype).key_shape)


def numpy_dtype(dtype: object) -> np.dtype:
    """The structured numpy dtype an element of a key array is held as (its words)."""
    shape = key_shape(dtype)
    return np.dtype([("words", np.uint32, shape)] if shape else [("words", np.uint32)])


def held_dtype(dtype: Any) -> Any:
    """`dtype` as the engine holds it: a key's structured numpy dtype; any other dtype
    (a numpy one, a semaphore's) unchanged."""
    return numpy_dtype(dtype) if is_key_dtype(dtype) else dtype


def physical_aval(aval: AbstractValue) -> AbstractValue:
    """A key-typed aval as XLA holds it (`uint32[*shape, *key_shape]`); others unchanged."""
    dtype = getattr(aval, "dtype", None)
    if not is_key_dtype(dtype):
        return aval
    shape = tuple(aval.shape)  # type: ignore[attr-defined]
    return ShapedArray(shape + key_shape(dtype), np.dtype(np.uint32))


def to_logical(words: np.ndarray, dtype: object) -> np.ndarray:
    """A key array's physical words (`uint32[*shape, *key_shape]`) as its keys (no copy
    where the words are contiguous)."""
    held = numpy_dtype(dtype)
    inner = key_shape(dtype)
    shape = words.shape[: words.ndim - len(inner)]
    contiguous = np.ascontiguousarray(words, dtype=np.uint32)
    return contiguous.reshape(-1).view(held).reshape(shape)


def to_physical(keys: np.ndarray) -> np.ndarray:
    """Keys (a structured array) as their words, `uint32[*shape, *key_shape]`; any
    other array unchanged."""
    if keys.dtype.fields is None:
        return keys
    inner = keys.dtype.fields["words"][0].shape
    return np.ascontiguousarray(keys).view(np.uint32).reshape(keys.shape + tuple(inner))


def words(keys: object) -> np.ndarray:
    """The words of a key array, `uint32[*shape, *key_shape]`."""
    array = np.asarray(keys)
    return np.asarray(array["words"], dtype=np.uint32) if array.dtype.fields else array


def from_words(words_: np.ndarray, dtype: object) -> np.ndarray:
    """Keys of `dtype` made of their words (`uint32[*shape, *key_shape]`)."""
    return to_logical(np.asarray(words_, dtype=np.uint32), dtype).copy()


# -- what JAX computes on keys of an implementation other than the Pallas TPU ones --------

def _jax_keys(keys: np.ndarray, dtype: object) -> jax.Array:
    wrapped: jax.Array = jax.random.wrap_key_data(jnp.asarray(words(keys)), impl=_impl(dtype))
    return wrapped


def jax_seed(seeds: np.ndarray, dtype: object) -> np.ndarray:
    """`random_seed` of `dtype`'s implementation, as JAX computes it."""
    keys = _prng.random_seed_p.bind(  # type: ignore[no-untyped-call]
        jnp.asarray(seeds), impl=_impl(dtype))
    return from_words(np.asarray(jax.random.key_data(keys)), dtype)


def jax_fold_in(keys: np.ndarray, data: np.ndarray, dtype: object) -> np.ndarray:
    """`random_fold_in` of `dtype`'s implementation, as JAX computes it."""
    folded = _prng.random_fold_in_p.bind(  # type: ignore[no-untyped-call]
        _jax_keys(keys, dtype), jnp.asarray(data))
    return from_words(np.asarray(jax.random.key_data(folded)), dtype)


def jax_bits(keys: np.ndarray, dtype: object, bit_width: int,
             shape: Sequence[int]) -> np.ndarray:
    """`random_bits` of `dtype`'s implementation, as JAX computes it."""
    bits = _prng.random_bits_p.bind(  # type: ignore[no-untyped-call]
        _jax_keys(keys, dtype), bit_width=bit_width, shape=tuple(shape))
    return np.asarray(bits)


def is_pallas_impl_dtype(dtype: object) -> bool:
    """Whether the keys are a Pallas TPU implementation's (the hardware PRNG's)."""
    return bool(_pl_random.is_pallas_impl(_impl(dtype)))

