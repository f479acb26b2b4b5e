"""The explicit MXU operations, which Mosaic accepts from TPU v7 on: `pltpu.matmul_push_rhs`
(an RHS into a staging register of an MXU), `pltpu.matmul_acc_lhs` (optionally the staged
RHS loaded into the MXU first, then LHS @ RHS added into the MXU's accumulator) and
`pltpu.matmul_pop` (an accumulator slice read out, and zeroed).

The semantics are JAX 0.10.2's statement of them (the docstrings of the three functions in
`jax/_src/pallas/mosaic/primitives.py`, their lowering to `tpu.matmul_push_rhs`,
`tpu.matmul_acc_lhs` and `tpu.matmul_pop`); the geometry (2 MXUs per core, 2 staging
registers per MXU, an accumulator of 256 addresses of one (8, 128) float32 tile each) is
what libtpu 0.0.42's compiler for v7x takes (engine/jaxpr/mxu_limits.py, which also makes
what it refuses a compile error before the call runs). None of it has been run on a chip:

- each core has its own MXUs, each its own staging registers, loaded RHS and accumulator;
  they persist across the core's grid steps (a kernel may accumulate over a reduction axis
  and pop at the last step), and a kernel starts with them empty and zero: JAX requires
  every kernel to leave no data in them ("The kernel must not leave any data in the
  staging registers / accumulator upon exit"), so a kernel that does is reported;
- `matmul_push_rhs(rhs, staging_register=r, mxu_index=i, transpose=t)` stages rhs (its
  transpose when t) in register r of MXU i; `matmul_acc_lhs(a, lhs, mxu_index=i,
  load_staged_rhs=r)` loads register r's RHS into MXU i (emptying the register) when r is
  given, else uses the RHS loaded last, and adds lhs @ rhs (float32) into the accumulator
  from address a; `matmul_pop(a, (M, 256), float32, i)` returns the accumulator from
  address a and zeroes it there;
- an (M, 256) result from address a: address a + 2g + h holds rows [8g, 8g + 8) and columns
  [128h, 128h + 128) (rows first: the compiler's bounds fit M / 4 addresses, its
  address layout is pallas-check's reading). A pop of the same address and shape as the
  accumulation -- what kernels do -- does not depend on it;
- the products: float32 accumulation of exact products of the operands as the MXU takes
  them. With `--chip-arithmetic` (on in `run`) a float32 operand is rounded to bfloat16
  first, as jaxbridge/chip_arithmetic.py does for a v5e's default-precision products
  (measured on a v5e; v7x's explicit operations are assumed to round alike, unverified);
  bfloat16 and float8 operands are exact either way.

What JAX forbids and the compiler does not see is an `MxuMisuse` event (checkers/mxu.py
makes it an `mxu-misuse` finding): a push into a staging register still holding an RHS no
matmul_acc_lhs loaded (JAX: "It is not allowed to push to the same staging register
twice"; the compiler refuses it only in straight-line code, "Cannot schedule FIFO push
instruction when the FIFO is full"), a load from an empty register, a matmul before any
RHS was loaded, and at the kernel's end an RHS still staged or accumulator addresses
added to and never popped. What the chip does then is not known: the simulation goes on
with the newer push, and an undefined RHS as the call's never-written fill (NaN by
default), so that its products show.
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.primitives import matmul_acc_lhs_p, matmul_pop_p, matmul_push_rhs_p
from pallas_check.jaxbridge.types import JaxprEqn
from pallas_check.engine.events import event_kind
from pallas_check.engine.verdicts import Where
from pallas_check.engine.jaxpr.avals import aval_shape
from pallas_check.engine.jaxpr.mxu_limits import ACCUMULATOR, SIDE, TILE, addresses
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.jaxpr.registry import rule
from pallas_check.engine.seam import Mxu, RunningCore, StagedRhs
from pallas_check.findings.finding import IndexRange, SourceFrame

_HELP = ("what a kernel leaves in an MXU is what the next kernel's matrix products on it"
         " start from")


@event_kind
class MxuMisuse(NamedTuple):
    """An explicit MXU operation against JAX's rules for them, or an MXU left holding data
    at the kernel's end (`where.frames`: the operation that did it, or that left the data);
    `part` names the staging register or the accumulator, `addresses` the accumulator's
    addresses concerned."""

    where: Where
    part: str
    addresses: IndexRange | None
    message: str
    help: str


def _mxu(ctx: RunningCore, index: int) -> Mxu:
    found = ctx.mxus.get(index)
    if found is None:
        found = ctx.mxus[index] = Mxu(
            accumulator=np.zeros((ACCUMULATOR, *TILE), np.float32),
            held=np.full(ACCUMULATOR, -1, np.int64))
    return found


def _misuse(ctx: RunningCore, part: str, message: str, advice: str,
            frames: tuple[SourceFrame, ...] | None = None,
            addresses: IndexRange | None = None,
            grid_point: tuple[int, ...] | None = None) -> None:
    """Tell the call of one misuse, at the equation evaluated (or at `frames` and
    `grid_point`: a push or matmul the kernel's end found the data of)."""
    if ctx.call.feeds.takes(MxuMisuse):
        where = Where(ctx.actor, ctx.device_id, ctx.core_id,
                      ctx.grid_point if frames is None else grid_point,
                      current_frames(ctx) if frames is None else frames)
        ctx.call.tell(MxuMisuse(where, part, addresses, message, advice))


def _register_name(index: int, register: int) -> str:
    return f"MXU {index} staging register {register}"


def _at_step(staged: StagedRhs) -> str:
    point = staged.grid_point
    return f" at grid point {point}" if point else ""


def _place(frames: tuple[SourceFrame, ...]) -> str:
    return f" at {frames[0].file}:{frames[0].line}" if frames else ""


# -- the values --------------------------------------------------------------------------

def product(lhs: np.ndarray, rhs: np.ndarray, rounded: bool) -> np.ndarray:
    """lhs @ rhs as the MXU computes it: exact products of its operands summed, one
    float32 result; `rounded`: float32 operands rounded to bfloat16 first (the chip's
    arithmetic, see the module)."""
    result: np.ndarray = (_as_taken(lhs, rounded) @ _as_taken(rhs, rounded)).astype(np.float32)
    return result


def _as_taken(x: np.ndarray, rounded: bool) -> np.ndarray:
    x = np.asarray(x)
    if rounded and x.dtype == np.float32:
        x = x.astype(ml_dtypes.bfloat16)
    return x.astype(np.float64)


def to_tiles(result: np.ndarray) -> np.ndarray:
    """An (M, 256) result as the accumulator holds it: (M / 4, 8, 128), rows first (the
    tile at offset 2g + h: rows [8g, 8g + 8), columns [128h, 128h + 128))."""
    rows = result.shape[0]
    grouped = result.reshape(rows // TILE[0], TILE[0], SIDE // TILE[1], TILE[1])
    return grouped.transpose(0, 2, 1, 3).reshape(-1, *TILE)


def from_tiles(tiles: np.ndarray, rows: int) -> np.ndarray:
    """`to_tiles` undone: the (rows, 256) result the tiles hold."""
    grouped = tiles.reshape(rows // TILE[0], SIDE // TILE[1], *TILE)
    return grouped.transpose(0, 2, 1, 3).reshape(rows, SIDE)


# -- the rules ---------------------------------------------------------------------------

@rule(matmul_push_rhs_p)
def _push_rhs(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    index, register = eqn_params.mxu_index(eqn), eqn_params.staging_register(eqn)
    assert register is not None  # (a push names its register)
    rhs = np.array(invals[0])  # a copy: the ref it was loaded from may change
    mxu = _mxu(ctx, index)
    frames = current_frames(ctx)
    earlier = mxu.staged.get(register)
    if earlier is not None:
        _misuse(ctx, _register_name(index, register),
                f"pltpu.matmul_push_rhs into {_register_name(index, register)}, which still"
                f" holds the RHS pushed{_place(earlier.frames)} that no matmul_acc_lhs"
                f" loaded: JAX forbids pushing to a staging register twice",
                f"load it first (matmul_acc_lhs(..., load_staged_rhs={register})), or push"
                f" into the other register; the simulation goes on with the newer RHS, the"
                f" chip's behaviour is not known")
    mxu.staged[register] = StagedRhs(rhs.T if eqn_params.rhs_transposed(eqn) else rhs, frames,
                                     ctx.grid_point)
    return []


def _loaded_rhs(ctx: RunningCore, mxu: Mxu, index: int, register: int | None) -> np.ndarray:
    """The RHS the matmul multiplies by: register's (emptied), or the one loaded before;
    one that does not exist is reported and is the call's fill."""
    if register is not None:
        staged = mxu.staged.pop(register, None)
        if staged is not None:
            mxu.rhs = staged.value
            return staged.value
        _misuse(ctx, _register_name(index, register),
                f"pltpu.matmul_acc_lhs loads {_register_name(index, register)}, which holds"
                f" no RHS (none pushed since it was last loaded)",
                f"push the RHS first (pltpu.matmul_push_rhs(rhs, staging_register={register},"
                f" mxu_index={index})); the simulation multiplies by the never-written fill")
    elif mxu.rhs is not None:
        return mxu.rhs
    else:
        _misuse(ctx, f"MXU {index}",
                f"pltpu.matmul_acc_lhs on MXU {index} with load_staged_rhs=None before any"
                f" RHS was loaded into it in this kernel: it multiplies by whatever an"
                f" earlier kernel left there",
                "load a pushed RHS at the first matmul (load_staged_rhs=the register);"
                " the simulation multiplies by the never-written fill")
    mxu.rhs = np.full((SIDE, SIDE), ctx.fill(np.dtype(np.float32)), np.float32)
    return mxu.rhs


@rule(matmul_acc_lhs_p)
def _acc_lhs(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    index, address = eqn_params.mxu_index(eqn), eqn_params.accumulator_address(eqn)
    mxu = _mxu(ctx, index)
    rhs = _loaded_rhs(ctx, mxu, index, eqn_params.staging_register(eqn))
    lhs = np.asarray(invals[0])
    tiles = to_tiles(product(lhs, rhs, ctx.config.chip_arithmetic))
    window = slice(address, address + len(tiles))
    np.add(mxu.accumulator[window], tiles, out=mxu.accumulator[window])
    mxu.sources.append(current_frames(ctx))
    mxu.held[window] = len(mxu.sources) - 1
    return []


@rule(matmul_pop_p)
def _pop(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    index, address = eqn_params.mxu_index(eqn), eqn_params.accumulator_address(eqn)
    rows = aval_shape(eqn.outvars[0])[0]
    mxu = _mxu(ctx, index)
    window = slice(address, address + addresses(rows))
    result = from_tiles(mxu.accumulator[window].copy(), rows)
    mxu.accumulator[window] = 0
    mxu.held[window] = -1
    return result


# -- the kernel's end ------------------------------------------------------------------------

def kernel_ended(ctx: RunningCore) -> None:
    """What the core leaves in its MXUs when the kernel ends: each RHS still staged and
    each run of accumulator addresses added to and never popped is reported (JAX: "The
    kernel must not leave any data in the staging registers / accumulator upon exit")."""
    for index, mxu in sorted(ctx.mxus.items()):
        for register, staged in sorted(mxu.staged.items()):
            name = _register_name(index, register)
            _misuse(ctx, name,
                    f"the kernel ends with an RHS in {name}, pushed{_at_step(staged)} and"
                    f" never loaded by a matmul_acc_lhs: {_HELP}",
                    "load every pushed RHS, or push only what a matmul_acc_lhs loads"
                    " (a last grid step has no next block to push)", staged.frames,
                    grid_point=staged.grid_point)
        held = np.flatnonzero(mxu.held >= 0)
        if len(held):
            first, last = int(held[0]), int(held[-1])
            frames = mxu.sources[int(mxu.held[first])]
            _misuse(ctx, f"MXU {index} accumulator",
                    f"the kernel ends with MXU {index}'s accumulator holding results at"
                    f" addresses {first}-{last} ({len(held)} of them), accumulated"
                    f"{_place(frames)} and never popped: {_HELP}",
                    "pltpu.matmul_pop every accumulator slice a matmul_acc_lhs added to"
                    " before the kernel ends", frames, ((first, last + 1),))
