"""Arithmetic on the CPU as a TPU computes it, where the two differ beyond rounding noise.

Measured on a TPU v5e (hardware/probes/numerics.py, hardware/README.md):

- **Matrix products.** A product of float32 operands at the default precision
  (`precision=None`, `DEFAULT`) rounds each operand to bfloat16 (round to nearest even) and
  accumulates the exact products in float32, in a Pallas kernel (Mosaic) and in the
  program's own XLA ops (XLA:TPU) alike; `HIGHEST` is float32 (about 1e-7 relative); a
  float32 operand beside a bfloat16 one is rounded too; bfloat16, int8 and float8 operands
  are exact. XLA:CPU computes every float32 product exactly, so a kernel's output and a
  test's `jnp.dot` reference would both differ from the chip's -- and a test comparing them
  with a `HIGHEST` or numpy reference would pass here and fail there.
- **`pl.reciprocal(x, approx=True)`, division, the logistic.** The chip's estimate is within
  1.6e-5 of 1/x (JAX's lowering for other platforms takes the reciprocal of x rounded to
  bfloat16: errors of 4e-3); its `1 / b` is one Newton step from that estimate and `a / b`
  is `a * (1 / b)`, up to an ulp or two from the correctly rounded quotient; Mosaic's
  logistic is `1 / (1 + exp(-x))`. Float32: computed bit for bit as the chip does
  (jaxbridge/chip_divide.py); other types: the reciprocal computed exactly.
- **`exp` and `exp2`.** The chip's are a table-and-quadratic approximation (up to 64 ulps
  from the correctly rounded value), the same in a kernel and in XLA:TPU; where a result is
  then rounded to bfloat16 (flash attention's `p` before the MXU) the difference decides
  the rounding. Computed here bit for bit as the chip does (jaxbridge/chip_exp.py).

`chip_arithmetic()` replaces XLA's CPU lowerings of `dot_general` (the operands the chip
rounds, rounded before the product), of `pl.reciprocal`, division, the logistic, `exp` and
`exp2` while it is open:
every product of the process lowered meanwhile (the script's program, the engine's
evaluation of a kernel, the compiled tier) computes what the chip computes, within the
chip's own accumulation-order noise. `HIGH` (which XLA:TPU computes in three bfloat16
passes and Mosaic refuses) stays exact here: the closer of the two without the chip's
exact algorithm. Convolutions are not rounded; the chip's other transcendental functions
(log, tanh, sqrt, ...) differ from XLA:CPU's by up to 4e-5 of their
largest value, which `diff` and `replay` allow (findings/output_diff.py). Other
generations: the v5e's rules, unverified.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax._src import config as _config
from jax._src.interpreters import mlir as _mlir
from jax._src.lax import lax as _lax
from jax._src.pallas import primitives as _pallas_primitives
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo as _hlo

from pallas_check.jaxbridge import chip_divide, chip_exp
from pallas_check.jaxbridge.lowering import LoweringRuleContext

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
    """The float32 value of `value` rounded to bfloat16 (nearest even), as HLO.

    Rounded in its bits (add 0x7FFF plus the lowest kept bit, clear the low 16; a NaN
    kept as it is), not by a convert to bfloat16 and back: XLA:CPU may drop such a pair
    of converts where it allows itself excess precision (`xla_allow_excess_precision`,
    on by default), and then the product is exact where the chip's is rounded -- the
    shipped flash attention's `p /= l; dot(p, v)` was 0.4 % off a v5e so (session 32,
    hardware/README.md)."""
    f32 = _ir.RankedTensorType.get(shape, _mlir.dtype_to_ir_type(np.dtype(np.float32)))
    u32_element = _ir.IntegerType.get_unsigned(32)
    u32 = _ir.RankedTensorType.get(shape, u32_element)

    def splat(number: int) -> "_ir.Value[_ir.RankedTensorType]":
        return _hlo.constant(_ir.DenseElementsAttr.get_splat(
            u32, _ir.IntegerAttr.get(u32_element, number)))

    x = cast(Any, value)
    bits = _hlo.bitcast_convert(u32, x)
    kept_low = _hlo.and_(_hlo.shift_right_logical(bits, splat(16)), splat(1))
    rounded = _hlo.and_(_hlo.add(_hlo.add(bits, splat(0x7FFF)), kept_low),
                        splat(0xFFFF0000))
    is_nan = _hlo.compare(x, x, _hlo.ComparisonDirectionAttr.get("NE"))
    return _hlo.select(is_nan, x, _hlo.bitcast_convert(f32, rounded))


# Which arithmetic the CPU lowerings give now: a value of JAX's configuration in the key
# of every cache JAX keeps of what it traced, lowered and compiled, so that a program
# compiled in one arithmetic is never run in the other, and switching empties no cache
# (the programs of each stay compiled for its next turn).
_OPTION = "jax_pallas_check_chip_arithmetic"
_arithmetic = _config.bool_state(
    _OPTION, False, "pallas-check: XLA:CPU's products and reciprocals as a TPU's.",
    include_in_jit_key=True, include_in_trace_context=True)


# Whether exp, exp2, division, reciprocals and the logistic are the chip's own functions
# (chip_exp.py, chip_divide.py) besides: bit for bit, but each such operation lowers to
# some fifty operations that XLA:CPU compiles in every program holding one -- a cold run of
# the benchmark's kernel repository took 23 % longer with them everywhere (benchmarks/
# README.md). So: where the chip is the reference (`diff`, `replay`) and with
# `--chip-functions`; products are rounded either way.
_FUNCTIONS = "jax_pallas_check_chip_functions"
_functions = _config.bool_state(
    _FUNCTIONS, False, "pallas-check: exp, division, ... as a TPU's, bit for bit.",
    include_in_jit_key=True, include_in_trace_context=True)


def _functions_on() -> bool:
    return bool(_arithmetic.value) and bool(_functions.value)


class _Mode:
    """Whether our lowerings are registered (once per process)."""

    installed = False


# The lowering rule's values and params are JAX's own (MLIR values): passed through.
def _rule(original: Callable[..., Sequence[object]]) -> Callable[..., Sequence[object]]:
    def lowering(ctx: LoweringRuleContext, lhs: object, rhs: object, *, precision: object,
                 **params: object) -> Sequence[object]:
        operands = [lhs, rhs]
        for which, aval in enumerate(ctx.avals_in):
            dtype, shape = getattr(aval, "dtype", None), tuple(getattr(aval, "shape", ()))
            if dtype == np.float32:
                if _arithmetic.value and rounds_operand(precision, which):
                    operands[which] = _to_bfloat16_and_back(operands[which], shape)
        return original(ctx, *operands, precision=precision, **params)
    return lowering


def in_effect() -> tuple[bool, bool]:
    """Whether products lowered now round as the chip's, and whether its functions are the
    chip's: part of the key of anything compiled from a kernel and kept beyond one call
    (the engine's segments)."""
    return bool(_arithmetic.value), _functions_on()


@contextlib.contextmanager
def chip_arithmetic(on: bool = True, functions: bool = True) -> Iterator[None]:
    """While open (`on`), XLA:CPU's float32 products round their operands as the MXU does,
    and reciprocals, division, the logistic and exp/exp2 are the chip's (see the module);
    `on=False` is IEEE float32 arithmetic, also inside an open one; `functions=False`
    leaves exp, division and the others to XLA:CPU (see `_functions`)."""
    _install()
    previous = bool(_arithmetic.value), bool(_functions.value)
    jax.config.update(_OPTION, on)  # type: ignore[no-untyped-call]
    jax.config.update(_FUNCTIONS, functions)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        jax.config.update(_OPTION, previous[0])  # type: ignore[no-untyped-call]
        jax.config.update(_FUNCTIONS, previous[1])  # type: ignore[no-untyped-call]


def _install() -> None:
    """Our lowerings, once per process: each asks which arithmetic to give."""
    if _Mode.installed:
        return
    rules = _mlir._platform_specific_lowerings["cpu"]
    original = rules.get(_lax.dot_general_p) or _mlir._lowerings[_lax.dot_general_p]
    reciprocal = (rules.get(_pallas_primitives.reciprocal_p)
                  or _mlir._lowerings[_pallas_primitives.reciprocal_p])
    _mlir.register_lowering(_lax.dot_general_p, cast(Any, _rule(original.rule)),
                            platform="cpu")
    _mlir.register_lowering(_pallas_primitives.reciprocal_p,
                            cast(Any, _reciprocal_rule(reciprocal.rule)), platform="cpu")
    functions = ((_lax.exp_p, chip_exp.exp_rule, chip_exp.applies),
                 (_lax.exp2_p, chip_exp.exp2_rule, chip_exp.applies),
                 (_lax.div_p, chip_divide.divide_rule, chip_divide.applies),
                 (_lax.logistic_p, _chip_logistic, chip_divide.applies))
    for primitive, chip, applies in functions:
        plain = rules.get(primitive) or _mlir._lowerings[primitive]
        _mlir.register_lowering(primitive, cast(Any, _function_rule(plain.rule, chip, applies)),
                                platform="cpu")
    _Mode.installed = True


_chip_logistic = chip_exp.lowered(
    lambda x: chip_divide.reciprocal_jnp(np.float32(1) + chip_exp.exp_jnp(-x)))


def _function_rule(original: Callable[..., Sequence[object]],
                   chip: Callable[..., Sequence[object]],
                   applies: Callable[..., bool]) -> Callable[..., Sequence[object]]:
    def lowering(ctx: LoweringRuleContext, *operands: object, **params: object
                 ) -> Sequence[object]:
        """exp, exp2 (float32 and bfloat16), division and the logistic (Mosaic's
        `1 / (1 + exp(-x))`; float32): the chip's own functions at the default accuracy
        while they are on (jaxbridge/chip_exp.py, chip_divide.py); else XLA:CPU's."""
        dtypes = [getattr(aval, "dtype", None) for aval in ctx.avals_in]
        if _functions_on() and params.get("accuracy") is None and applies(*dtypes):
            return chip(ctx, *operands)
        return original(ctx, *operands, **params)
    return lowering


def _reciprocal_rule(original: Callable[..., Sequence[object]]
                     ) -> Callable[..., Sequence[object]]:
    def lowering(ctx: LoweringRuleContext, x: object, **params: object) -> Sequence[object]:
        """`pl.reciprocal`: of a float32, the chip's estimate (approximate) or its full
        reciprocal (jaxbridge/chip_divide.py); of another type, the reciprocal computed
        exactly (see the module)."""
        if not _arithmetic.value:
            return original(ctx, x, **params)
        if _functions_on() and chip_divide.applies(getattr(ctx.avals_in[0], "dtype", None)):
            chip = chip_divide.estimate_rule if params.get("approx") else \
                chip_divide.reciprocal_rule
            return chip(ctx, x)
        one = _mlir.full_like_aval(ctx, 1, cast(Any, ctx.avals_in[0]))
        return [_hlo.divide(one, cast(Any, x))]
    return lowering
