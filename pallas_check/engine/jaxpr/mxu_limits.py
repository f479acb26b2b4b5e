"""The explicit MXU operations (`pltpu.matmul_push_rhs`, `matmul_acc_lhs`, `matmul_pop`):
the MXU's geometry as the compiler states it, and what the compiler refuses in them, per
TPU generation, found before a call is simulated (engine/jaxpr/mosaic_limits.py makes each
refusal a `compile-error` finding; the call is skipped, as the chip never runs it).

Every number and message here was seen by compiling kernels with libtpu 0.0.42 (JAX
0.10.2's) for v5e, v6e and v7x with `pallas-check compile` (no TPU; the kernels are
probes; tests/scripts/mxu_cases.py keeps one call per refusal, and
tests/engine/jaxpr/test_mxu_limits.py compares these refusals with libtpu's):

- before v7 every one of the three operations is refused: "Explicit MXU ops not supported
  on TPU generations < 7." (at the first one, as Mosaic reports it);
- on v7x: 2 MXUs per TensorCore (index 2 or 3: an LLO_CHECK failure, "mxu_id <
  target.MxusPerTensorCore() (2 < 2)"; 4 and above abort libtpu's process), 2 staging
  registers per MXU (register 2: "Mosaic: 2"); the pushed RHS 256 x 256; the LHS 256 columns, its
  rows a multiple of 8 x packing (8 for float32, 16 for bfloat16, 32 for float8); operands
  float32, bfloat16, float8_e5m2 or float8_e4m3fn, in any mix (int8, int32, float16 and
  float8_e4m3b11fnuz refused by their MLIR names, "'i8'"); a popped result float32 (int32:
  "'i32'"), 256 columns and rows a multiple of 8;
- the accumulator of a v7x MXU: 256 addresses, one per (8, 128) float32 tile: an (M, 256)
  result takes M / 4 addresses (an (8, 256) one fits from address 254, not 255; (1024,
  256) from 0, (2048, 256) nowhere: "OOB accumulator access." at a matmul_acc_lhs,
  "Reading the MXU accumulator out of bounds." at a pop). An odd address fails inside
  libtpu (an internal error, "RET_CHECK failure"); even ones compile.

Which address holds which tile of a result is not stated anywhere; engine/rules/mxu.py
takes rows first (module docstring there). None of it has been run on a chip.
"""

from __future__ import annotations

from typing import cast

import ml_dtypes
import numpy as np

from pallas_check.config import TpuGeneration
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.primitives import matmul_acc_lhs_p, matmul_pop_p, matmul_push_rhs_p
from pallas_check.jaxbridge.types import JaxprEqn, Var
from pallas_check.engine.jaxpr.avals import aval_dtype, aval_shape

MXU_PRIMITIVES = frozenset((matmul_push_rhs_p, matmul_acc_lhs_p, matmul_pop_p))

FIRST_GENERATION = 7  # the first TPU generation whose compiler takes them
MXUS = 2  # per TensorCore (v7x)
STAGING_REGISTERS = 2  # per MXU
SIDE = 256  # the RHS is SIDE x SIDE; the LHS and a result SIDE columns wide
TILE = (8, 128)  # one accumulator address: an (8, 128) float32 tile
ACCUMULATOR = 256  # addresses per MXU

# The operand types the v7x compiler takes, by the name its messages give them.
_OPERANDS = {np.dtype(np.float32): "f32", np.dtype(ml_dtypes.bfloat16): "bf16",
             np.dtype(ml_dtypes.float8_e5m2): "f8E5M2",
             np.dtype(ml_dtypes.float8_e4m3fn): "f8E4M3FN"}
_OTHER_NAMES = {np.dtype(np.float16): "f16", np.dtype(np.float64): "f64",
                np.dtype(ml_dtypes.float8_e4m3b11fnuz): "f8E4M3B11FNUZ"}

# A refusal: our sentence, and the compiler's own words.
Refusal = tuple[str, str]


def generation_number(tpu: TpuGeneration) -> int:
    """7 for v7x, 6 for v6e, ..."""
    return int(TpuGeneration(tpu).value[1:].rstrip("abcdefghijklmnopqrstuvwxyz"))


def addresses(rows: int) -> int:
    """How many accumulator addresses an (rows, SIDE) float32 result takes."""
    return rows // TILE[0] * (SIDE // TILE[1])


def mlir_name(dtype: object) -> str:
    """An element type as Mosaic's messages name it (i8, bf16, f8E4M3FN, ...)."""
    d = np.dtype(dtype)  # type: ignore[call-overload]  # (a dtype or a scalar type)
    if d in _OPERANDS:
        return _OPERANDS[d]
    if d in _OTHER_NAMES:
        return _OTHER_NAMES[d]
    return f"i{d.itemsize * 8}" if d.kind in "iub" else d.name


def _vector(shape: tuple[int, ...], dtype: object) -> str:
    return f"'vector<{'x'.join(map(str, shape))}x{mlir_name(dtype)}>'"


def mxu_refusal(eqn: JaxprEqn, tpu: TpuGeneration) -> Refusal | None:
    """What the compiler for `tpu` refuses in one explicit MXU operation (see the module),
    or None when it compiles."""
    generation = generation_number(tpu)
    if generation < FIRST_GENERATION:
        return (f"the explicit MXU operations (pltpu.matmul_push_rhs, matmul_acc_lhs,"
                f" matmul_pop) do not lower for TPU {TpuGeneration(tpu).value}: Mosaic takes"
                f" them from TPU v7 on",
                f"Explicit MXU ops not supported on TPU generations < {FIRST_GENERATION}.")
    index = eqn_params.mxu_index(eqn)
    if not 0 <= index < MXUS:
        return (f"MXU {index} does not exist: a v7x TensorCore has {MXUS} MXUs (0 and 1)",
                f"mxu_id < target.MxusPerTensorCore() ({index} < {MXUS})")
    register = eqn_params.staging_register(eqn)
    if register is not None and not 0 <= register < STAGING_REGISTERS:
        return (f"staging register {register} does not exist: each v7x MXU has"
                f" {STAGING_REGISTERS} (0 and 1)", f"{register}")
    if eqn.primitive is matmul_push_rhs_p:
        return _operand(eqn, "the pushed RHS", (SIDE, SIDE))
    if eqn.primitive is matmul_acc_lhs_p:
        return _operand(eqn, "the LHS", None) or _address(eqn, aval_shape(_operand_var(eqn)))
    shape, dtype = aval_shape(eqn.outvars[0]), aval_dtype(eqn.outvars[0])
    if dtype != np.float32:
        return (f"a popped {dtype.name} result does not lower: the v7x MXU accumulates"
                f" float32", f"'{mlir_name(dtype)}'")
    return _result_shape(shape, dtype) or _address(eqn, shape)


def _operand(eqn: JaxprEqn, what: str, wanted: tuple[int, int] | None) -> Refusal | None:
    """An RHS (`wanted`: its one shape) or an LHS (`wanted` None) Mosaic refuses."""
    var = _operand_var(eqn)
    shape, dtype = aval_shape(var), aval_dtype(var)
    if dtype not in _OPERANDS:
        return (f"{what} is {dtype.name}: the v7x MXU takes float32, bfloat16, float8_e5m2"
                f" and float8_e4m3fn operands", f"'{mlir_name(dtype)}'")
    vector = _vector(shape, dtype)
    if wanted is not None:
        if shape != wanted:
            return (f"{what} is {shape}, not {wanted}",
                    f"The pushed RHS must be {SIDE}x{SIDE}, but got {vector}")
        return None
    if len(shape) != 2 or shape[1] != SIDE:
        return (f"{what} is {shape}: its contracting dimension must be {SIDE}",
                f"The LHS contracting dimension must be {SIDE}, but got {vector}")
    return _rows(shape, dtype, what)


def _rows(shape: tuple[int, ...], dtype: np.dtype, what: str) -> Refusal | None:
    multiple = TILE[0] * 4 // dtype.itemsize  # 8 rows of 32-bit words, packed
    if shape[0] % multiple:
        return (f"{what} has {shape[0]} rows: a multiple of {multiple} for {dtype.name}",
                f"The non-contracting dimension of the LHS must be a multiple of {multiple}"
                f" for '{mlir_name(dtype)}', but got {_vector(shape, dtype)}")
    return None


def _operand_var(eqn: JaxprEqn) -> Var:
    # The pushed RHS or the LHS: an array operand (a Literal has an aval as a Var does).
    return cast(Var, eqn.invars[0])


def _result_shape(shape: tuple[int, ...], dtype: np.dtype) -> Refusal | None:
    if len(shape) != 2 or shape[1] != SIDE:
        return (f"a popped result of shape {shape}: it must be {SIDE} columns wide",
                f"The RHS non-contracting dimension must be {SIDE}, but got"
                f" {_vector(shape, dtype)}")
    return _rows(shape, dtype, "a popped result")


def _address(eqn: JaxprEqn, shape: tuple[int, ...]) -> Refusal | None:
    """The accumulator addresses an (M, 256) result takes from the operation's address."""
    address, taken = eqn_params.accumulator_address(eqn), addresses(shape[0])
    popping = eqn.primitive is matmul_pop_p
    if address < 0 or address + taken > ACCUMULATOR:
        return (f"accumulator addresses {address}-{address + taken - 1} (a result of"
                f" {shape[0]} rows takes {taken}) are outside the MXU's {ACCUMULATOR}",
                "Reading the MXU accumulator out of bounds." if popping
                else "OOB accumulator access.")
    if address % 2:
        return (f"accumulator address {address} is odd: libtpu fails on it with an internal"
                f" error (even addresses compile)", "RET_CHECK failure")
    return None
