"""Probe: float32 subnormals on the chip, and which random bits round `pltpu.stochastic_round`
up, per target dtype.

Session 30's recording of `samples/stochastic_round_ok.py` showed a v5e rounding the
subnormal input 3 * 2^-130 to 0 (not to one of its bfloat16 neighbours, which hold it
exactly), and rounding a bfloat16 target up exactly when the random word's bits 7..22 are
below the input's low 16 mantissa bits. This probe asks the two questions that follow:

1. Subnormals: does the chip flush them everywhere (an input read by a vector op, a result
   that underflows), or only in the conversion? Per op, in a kernel and as the program's
   own XLA op: copy (load/store), x * 1, x + 0, max(x, 0), x > 0, a product whose result
   is subnormal, the conversion to bfloat16.
2. Stochastic rounding to each float8 target (and bfloat16 again): the inputs and random
   words are kept with the chip's results, so the rule is read off them on a CPU
   (`hardware/extract.py`); values include ones below the target's normal range, negative
   ones and ones beyond its largest finite value.

Usage: python subnormals.py   (OUT=folder for subnormals.npz / subnormals.json)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from common import Results, call, main_guard

TINY = np.float32(np.finfo(np.float32).tiny)  # 2^-126, the smallest normal


def subnormal_inputs() -> np.ndarray:
    """(8, 128) float32: subnormals of both signs and sizes, the smallest normals, zeros."""
    bits = np.concatenate([
        np.array([1, 2, 3, 0x1000, 0x3FFFFF, 0x400000, 0x7FFFFF], np.uint32),
        np.array([1, 3, 0x400000, 0x7FFFFF], np.uint32) | np.uint32(0x80000000),
        np.array([0x800000, 0x800001, 0, 0x80000000], np.uint32)])
    rng = np.random.default_rng(30)
    rest = rng.integers(1, 0x800000, size=8 * 128 - bits.size, dtype=np.uint32)
    rest |= rng.integers(0, 2, size=rest.size, dtype=np.uint32) << 31
    return np.concatenate([bits, rest]).view(np.float32).reshape(8, 128)


OPS = {
    "copy": lambda x, y: x,
    "times_one": lambda x, y: x * 1.0,
    "plus_zero": lambda x, y: x + 0.0,
    "max_zero": lambda x, y: jnp.maximum(x, 0.0),
    "gt_zero": lambda x, y: (x > 0.0).astype(jnp.float32),
    "ne_zero": lambda x, y: (x != 0.0).astype(jnp.float32),
    "underflow_product": lambda x, y: y * np.float32(2.0 ** -20),  # y normal, result subnormal
    "times_2_23": lambda x, y: x * np.float32(2.0 ** 23),
    "to_bf16_and_back": lambda x, y: x.astype(jnp.bfloat16).astype(jnp.float32),
}


def kernel_op(op):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = op(x_ref[...], y_ref[...])
    return kernel


def run_subnormals(res: Results) -> None:
    x = jnp.asarray(subnormal_inputs())
    y = jnp.asarray(np.abs(np.asarray(x)) + TINY)  # normals just above 2^-126
    res.array("sub.x", x)
    res.array("sub.y", y)
    spec = pl.BlockSpec((8, 128), lambda: (0, 0))
    for name, op in OPS.items():
        f = call(kernel_op(op), in_specs=[spec, spec], out_specs=spec,
                 out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
        res.case(f"sub.kernel.{name}", lambda f=f: jax.jit(f)(x, y))
        res.case(f"sub.xla.{name}", lambda op=op: jax.jit(op)(x, y))


def sr_inputs(target) -> np.ndarray:
    """(ROWS, 128) float32: 128 values (a column each) repeated down the rows."""
    info = jnp.finfo(target)
    tiny, big = float(info.tiny), float(info.max)
    rng = np.random.default_rng(31)
    values = rng.standard_normal(128).astype(np.float32)
    special = [1 + 2 ** -9, -(1 + 3 * 2 ** -10), 1.0, 0.0, 3 * 2 ** -130, -3 * 2 ** -130,
               tiny * 0.3, -tiny * 0.7, tiny * 1.37, big * 0.999, big * 1.001, -big * 1.001,
               1e30, float(np.finfo(np.float32).max)]
    values[:len(special)] = np.array(special, np.float32)
    values[len(special):32] *= np.float32(tiny * 4)  # around the target's smallest normals
    return np.broadcast_to(values, (ROWS, 128)).astype(np.float32)


ROWS = 512


def run_stochastic(res: Results) -> None:
    bits = jax.random.bits(jax.random.key(30), (ROWS, 128), dtype=jnp.uint32)
    res.array("sr.bits", bits)
    spec = pl.BlockSpec((ROWS, 128), lambda: (0, 0))
    for target in (jnp.bfloat16, jnp.float8_e5m2, jnp.float8_e4m3fn, jnp.float8_e4m3b11fnuz):
        name = jnp.dtype(target).name
        x = jnp.asarray(sr_inputs(target))
        res.array(f"sr.{name}.x", x)

        def kernel(x_ref, b_ref, o_ref, target=target):
            o_ref[...] = pltpu.stochastic_round(x_ref[...], b_ref[...], target_dtype=target)
        f = call(kernel, in_specs=[spec, spec], out_specs=spec,
                 out_shape=jax.ShapeDtypeStruct((ROWS, 128), target))
        res.case(f"sr.{name}.out",
                 lambda f=f, x=x: jax.lax.bitcast_convert_type(
                     jax.jit(f)(x, bits),
                     jnp.uint16 if jnp.dtype(target).itemsize == 2 else jnp.uint8))


def run(res: Results) -> None:
    run_subnormals(res)
    run_stochastic(res)


if __name__ == "__main__":
    main_guard(run, "subnormals")
