"""Typed reads of a variable's abstract value, for the places that know it is an array.

JAX types `Var.aval` as `AbstractValue`, which has no shape or dtype; the value of a
kernel's array variable (a load's result, a loop's output) is a `ShapedArray`. These say
so once, with `cast` (no check at run time: the rules that call them run at every step).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from pallas_check.jaxbridge.types import ShapedArray, Var


def array_aval(v: Var) -> ShapedArray:
    """The abstract value of an array variable (not a ref's nor a semaphore's)."""
    return cast(ShapedArray, v.aval)


def aval_dtype(v: Var) -> np.dtype:
    """The numpy dtype of an array variable's values."""
    dtype: np.dtype = np.dtype(cast(ShapedArray, v.aval).dtype)
    return dtype


def aval_shape(v: Var) -> tuple[int, ...]:
    """The shape of an array variable's values."""
    return tuple(cast(ShapedArray, v.aval).shape)
