"""Matrix products on the CPU rounded as a TPU's MXU rounds them.

Measured on a TPU v5e (hardware/probes/numerics.py, hardware/README.md "Matrix products"):
a product of float32 operands at the default precision (`precision=None`, `DEFAULT`) rounds
each operand to bfloat16 (round to nearest even) and accumulates the exact products in
float32, in a Pallas kernel (Mosaic) and in the program's own XLA ops (XLA:TPU) alike;
`HIGHEST` is float32 (about 1e-7 relative); a float32 operand beside a bfloat16 one is
rounded too; bfloat16, int8 and float8 operands are exact. XLA:CPU computes every float32
product exactly, so a kernel's output and a test's `jnp.dot` reference would both differ
from the chip's -- and a test comparing them with a `HIGHEST` or numpy reference would
pass here and fail there.

`chip_matmul()` replaces XLA's CPU lowering of `dot_general` with one that rounds the
operands the chip rounds before the product: every product of the process lowered while
it is installed (the script's program, the engine's evaluation of a kernel, the compiled
tier) computes what the chip computes, within the chip's own accumulation-order noise.
`HIGH` (which XLA:TPU computes in three bfloat16 passes and Mosaic refuses) stays exact
here: the closest of the two without the chip's exact algorithm. Convolutions are not
rounded. Other generations: the v5e's rule, unverified.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence, cast

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax._src.interpreters import mlir as _mlir
from jax._src.lax import lax as _lax
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo as _hlo

from pallas_check.jaxbridge.lowering import LoweringRuleContext, forget_lowered_modules

_ROUNDED_PRESETS = frozenset({"BF16_BF16_F32", "BF16_BF16_BF16"})  # one bfloat16 pass
_ONE_PASS = frozenset({lax.Precision.DEFAULT})


def rounds_operand(precision: object, which: int) -> bool:
    """Whether operand `which` (0: lhs, 1: rhs) of a float32 product at `precision` (the
    equation's param: None, a pair of `lax.Precision`, a `DotAlgorithmPreset`) is rounded
    to bfloat16 on the chip."""
    if precision is None:
        return True
    if isinstance(precision, lax.DotAlgorithmPreset):
        return precision.name in _ROUNDED_PRESETS or precision.name == "DEFAULT"
    if isinstance(precision, (tuple, list)) and len(precision) == 2:
        return precision[which] in _ONE_PASS
    if isinstance(precision, lax.Precision):
        return precision in _ONE_PASS
    return False  # a DotAlgorithm spelled out: left as asked


def _to_bfloat16_and_back(value: object, shape: tuple[int, ...]) -> object:
    """The float32 value of `value` rounded to bfloat16 (nearest even), as HLO."""
    bf16 = _ir.RankedTensorType.get(shape, _mlir.dtype_to_ir_type(np.dtype(jnp.bfloat16)))
    f32 = _ir.RankedTensorType.get(shape, _mlir.dtype_to_ir_type(np.dtype(np.float32)))
    return _hlo.convert(f32, _hlo.convert(bf16, cast(Any, value)))


# The lowering rule's values and params are JAX's own (MLIR values): passed through.
def _rule(original: Callable[..., Sequence[object]]) -> Callable[..., Sequence[object]]:
    def lowering(ctx: LoweringRuleContext, lhs: object, rhs: object, *, precision: object,
                 **params: object) -> Sequence[object]:
        operands = [lhs, rhs]
        for which, aval in enumerate(ctx.avals_in):
            dtype, shape = getattr(aval, "dtype", None), tuple(getattr(aval, "shape", ()))
            if dtype == np.float32 and rounds_operand(precision, which):
                operands[which] = _to_bfloat16_and_back(operands[which], shape)
        return original(ctx, *operands, precision=precision, **params)
    return lowering


@contextlib.contextmanager
def chip_matmul(on: bool = True) -> Iterator[None]:
    """While open, XLA:CPU's float32 products round their operands as the MXU does."""
    if not on:
        yield
        return
    rules = _mlir._platform_specific_lowerings["cpu"]
    saved = rules.get(_lax.dot_general_p)
    original = (saved.rule if saved is not None
                else _mlir._lowerings[_lax.dot_general_p].rule)
    _mlir.register_lowering(_lax.dot_general_p, cast(Any, _rule(original)), platform="cpu")
    forget_lowered_modules()  # JAX keeps lowered modules by jaxpr: lowered again
    try:
        yield
    finally:
        if saved is not None:
            rules[_lax.dot_general_p] = saved
        else:
            rules.pop(_lax.dot_general_p, None)
        forget_lowered_modules()


