"""`differs`: whether two outputs differ element by element, as the exposure checks ask
(engine/call/exposures.py). A NaN equals a NaN; bits a kernel moved unchanged (a
signalling NaN through a bitcast) are compared without a numpy warning reaching the
user's stderr (the engine never prints)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from pallas_check.engine.call.exposures import differs

# float32 bit patterns: a signalling NaN, a quiet NaN with a payload, 1.0, 2.0.
_SNAN, _QNAN, _ONE, _TWO = 0xFF800123, 0x7FC00001, 0x3F800000, 0x40000000


def _f32(*bits: int) -> np.ndarray:
    return np.array(bits, np.uint32).view(np.float32)


def test_a_signalling_nan_is_compared_without_a_warning():
    a = _f32(_SNAN, _SNAN, _ONE, _ONE)
    b = _f32(_SNAN, _QNAN, _SNAN, _TWO)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = differs(a, b)
    np.testing.assert_array_equal(got, [False, False, True, True])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_narrow_floats_differ_where_their_values_do(dtype):
    a = np.array([np.nan, 1.0, 2.0, -0.0], dtype)
    b = np.array([np.nan, 1.0, 3.0, 0.0], dtype)
    np.testing.assert_array_equal(differs(a, b), [False, False, True, False])


def test_integers_differ_where_their_values_do():
    a = np.array([1, 2, 3], np.int32)
    np.testing.assert_array_equal(differs(a, np.array([1, 5, 3], np.int32)),
                                  [False, True, False])
