"""A small jitted training step with two kernels, run for N steps (issue 29's loop).

Usage: train_loop.py [STEPS] -- STEPS defaults to 500. With TRAIN_LOOP_INTERPRET=1 the
pallas_calls run under JAX's own HLO interpreter (`interpret=True`), the baseline
benchmarks/loop.py compares `pallas-check run --calls 2` against. Prints a checksum of the
final parameters, so that two runs can be compared.

The kernels: `matmul` (a BlockSpec grid over row blocks, no DMA of its own) computes the
forward pass and the gradient; `sgd_update` copies the gradient from HBM into VMEM with a
DMA and a semaphore, then writes `w - lr * grad` (with TRAIN_LOOP_DMA=0, `sgd_plain`
does the same with no DMA: both kernels are then pure).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

INTERPRET = os.environ.get("TRAIN_LOOP_INTERPRET") == "1"
DMA = os.environ.get("TRAIN_LOOP_DMA", "1") == "1"
ROWS, FEATURES, BLOCK = 64, 128, 16
LEARNING_RATE = 1e-3


def matmul_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def matmul(a, b):
    rows, inner = a.shape
    return pl.pallas_call(
        matmul_kernel, interpret=INTERPRET,
        grid=(rows // BLOCK,),
        in_specs=[pl.BlockSpec((BLOCK, inner), lambda i: (i, 0)),
                  pl.BlockSpec((inner, b.shape[1]), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((BLOCK, b.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, b.shape[1]), jnp.float32),
    )(a, b)


def sgd_kernel(w_ref, grad_hbm, o_ref, grad_vmem, sem):
    copy = pltpu.make_async_copy(grad_hbm, grad_vmem, sem)
    copy.start()
    copy.wait()
    o_ref[...] = w_ref[...] - LEARNING_RATE * grad_vmem[...]


def sgd_plain_kernel(w_ref, grad_ref, o_ref):
    o_ref[...] = w_ref[...] - LEARNING_RATE * grad_ref[...]


def sgd_update(w, grad):
    if not DMA:  # the update as a plain elementwise kernel: no DMA, no semaphore
        return pl.pallas_call(
            sgd_plain_kernel, interpret=INTERPRET,
            out_shape=jax.ShapeDtypeStruct(w.shape, w.dtype))(w, grad)
    return pl.pallas_call(
        sgd_kernel, interpret=INTERPRET,
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct(w.shape, w.dtype),
        scratch_shapes=[pltpu.VMEM(w.shape, w.dtype), pltpu.SemaphoreType.DMA],
    )(w, grad)


@jax.jit
def train_step(w, x, y):
    error = matmul(x, w) - y  # (ROWS, FEATURES)
    grad = matmul(x.T, error) / ROWS  # (FEATURES, FEATURES)
    return sgd_update(w, grad)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((ROWS, FEATURES)), jnp.float32)
    true_w = jnp.asarray(rng.standard_normal((FEATURES, FEATURES)), jnp.float32) / 10
    y = x @ true_w
    w = jnp.zeros((FEATURES, FEATURES), jnp.float32)
    for _ in range(steps):
        w = train_step(w, x, y)
    w = np.asarray(w)
    print(f"train_loop: {steps} steps, checksum {float(np.abs(w).sum()):.6f},"
          f" loss {float(np.mean((np.asarray(x) @ w - np.asarray(y)) ** 2)):.6f}")


if __name__ == "__main__":
    main()
