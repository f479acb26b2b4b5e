"""What session 33 learned of how a v5e's MXU adds a product's terms (analysis, not yet the
simulation's): the order and roundings that reproduce the chip's float32 sums.

For `x (M, K) @ y (K, N)` of bfloat16 values (a float32 product at the default precision
rounds its operands to bfloat16 first; each term is then exact in float32):

1. K is cut into passes of 128; each pass's result is added to the previous passes' in
   float32, in order;
2. within a pass, the terms go in groups of 8 consecutive k; adjacent pairs (k, k+1) are
   added exactly, the two pair sums of each half added and rounded to float32 (nearest even),
   the two halves added and rounded;
3. the groups' sums are accumulated in order, each addition rounded to float32.

Reproduces every one of the chip's sums of random normal operands for K = 32, 64, 128, 256
and 512, in `jnp.dot` and `q @ k^T` form, of bfloat16 and float32 operands (61,440 sums),
and all but 22 of the shipped flash attention's 393,216 scores on the kernel repository's
operands; of operands spread over e^+-6,
87-96 % (the rounding inside a group is not yet exactly the chip's). Evidence:
hardware/probes/mxu_order.py, hardware/chip/v5e/mxu_order.npz, hardware/README.md.
"""

from __future__ import annotations

import numpy as np

PASS, GROUP = 128, 8


def _to_float32(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32).astype(np.float64)


def _one_pass(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    terms = x[:, :, None].astype(np.float64) * y[None, :, :].astype(np.float64)  # M, K, N
    m, k, n = terms.shape
    grouped = terms.reshape(m, k // GROUP, GROUP, n)
    pairs = grouped[:, :, 0::2, :] + grouped[:, :, 1::2, :]
    halves = _to_float32(pairs[:, :, 0::2, :] + pairs[:, :, 1::2, :])
    groups = _to_float32(halves[:, :, 0, :] + halves[:, :, 1, :])
    total = np.zeros((m, n))
    for g in range(k // GROUP):
        total = _to_float32(total + groups[:, g, :])
    return total


def product(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The chip's float32 `x @ y` for float32 arrays holding bfloat16 values (K a multiple
    of 8)."""
    k = x.shape[1]
    total = None
    for start in range(0, k, PASS):
        part = _one_pass(x[:, start:start + PASS], y[start:start + PASS])
        total = part if total is None else _to_float32(total + part)
    assert total is not None
    return total.astype(np.float32)
