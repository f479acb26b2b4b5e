"""The parameters of the JAX equations pallas-check evaluates, read by meaning.

A rule asks `operand_tree(eqn)` or `while_loop(eqn)`, never `eqn.params["tree"]`: JAX names
these parameters, renames them between versions (0.11 renames scan's), and this file is the
one place that knows the names. Each accessor is a plain function (one dict lookup more than
the bare read), and rules that run per grid step read them once per equation when they can.

A pallas_call's own parameters are not read here but in `call.py`, whole, into a
`CallDescription`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from pallas_check.jaxbridge.types import Atom, ClosedJaxpr, Jaxpr, JaxprEqn, TransformedRef


# The params of an equation or a jitted call as JAX gives them (read only here, by key).
Params = Mapping[str, Any]


# -- refs, DMAs, semaphores ----------------------------------------------------------------

def operand_tree(eqn: JaxprEqn) -> Any:
    """The pytree that unflattens the equation's flat operands into their structure (a
    ref and its transforms, a DMA's refs and semaphores, a loop's bounds and carry):
    `tree` of the state, DMA and SparseCore primitives."""
    return eqn.params["tree"]


def args_tree(eqn: JaxprEqn) -> Any:
    """The same pytree for Pallas' masked load / store and the semaphore primitives
    (`args_tree`)."""
    return eqn.params["args_tree"]


def adds(eqn: JaxprEqn) -> bool:
    """Whether a DMA or SparseCore store adds into its destination (`add=True`)."""
    return bool(eqn.params.get("add", False))


def device_id_type(eqn: JaxprEqn) -> Any:
    """How a remote DMA or semaphore signal names its device (logical / mesh), or None."""
    return eqn.params.get("device_id_type")


@dataclasses.dataclass(frozen=True)
class DmaOperand:
    """One argument of a DMA (src, dst, dst_sem, src_sem, device_id): where its leaves sit
    in the equation's flat operands, and the pytree that unflattens those leaves into it (a
    ref, a `TransformedRef`, a value, or nothing)."""

    start: int
    stop: int
    tree: Any  # has `num_leaves` and `unflatten(leaves)` (a PyTreeDef or `_JoinedRef`)


class _JoinedRef:
    """jax 0.9's DMA operands keep a ref and its transforms as two siblings of the tree;
    this joins the pair back into the one `TransformedRef` jax 0.10 keeps, so that what
    reads a DMA argument reads the same value on both versions."""

    def __init__(self, ref: Any, transforms: Any) -> None:
        self._ref, self._transforms = ref, transforms
        self.num_leaves = ref.num_leaves + transforms.num_leaves

    def unflatten(self, leaves: Any) -> Any:
        leaves = list(leaves)
        cut = self._ref.num_leaves
        ref = self._ref.unflatten(leaves[:cut])
        transforms = _unwrap_transforms(self._transforms.unflatten(leaves[cut:]))
        return TransformedRef(ref, tuple(transforms)) if transforms else ref


def _unwrap_transforms(transforms: Any) -> Any:
    """jax 0.9 wraps a ref's transforms that are refs themselves (SparseCore's indexed
    DMAs) for flattening; JAX's own unwrapping turns them back."""
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    unwrap = getattr(mosaic_primitives, "_maybe_unwrap_transformed_refs", None)
    return transforms if unwrap is None else unwrap(transforms)


def dma_operands(eqn: JaxprEqn) -> tuple[DmaOperand, ...]:
    """The five arguments of a DMA start or wait (src, dst, dst_sem, src_sem, device_id).
    jax 0.10 flattens them as five children of `tree`; jax 0.9 as nine (each of the four
    refs followed by its transforms, then the device id)."""
    children = list(operand_tree(eqn).children())
    if len(children) == 9:  # jax 0.9
        trees: list[Any] = [_JoinedRef(children[k], children[k + 1]) for k in (0, 2, 4, 6)]
        trees.append(children[8])
    else:
        trees = children
    out, start = [], 0
    for tree in trees:
        out.append(DmaOperand(start, start + tree.num_leaves, tree))
        start += tree.num_leaves
    return tuple(out)


def dma_arguments(eqn: JaxprEqn, flat: Any) -> tuple[Any, ...]:
    """The DMA's five arguments unflattened from its flat operands (or their avals)."""
    flat = list(flat)
    return tuple(a.tree.unflatten(flat[a.start:a.stop]) for a in dma_operands(eqn))


# -- SparseCore vector ops -----------------------------------------------------------------

def has_mask(eqn: JaxprEqn) -> bool:
    return bool(eqn.params["has_mask"])


def descending(eqn: JaxprEqn) -> bool:
    return bool(eqn.params["descending"])


def reduces(eqn: JaxprEqn) -> Any:
    """A SparseCore all-reduce's `reduce` parameter (whether it reduces across lanes)."""
    return eqn.params["reduce"]


def pack_format(eqn: JaxprEqn) -> Any:
    """The format value of a SparseCore pack / unpack (its enum's `.value`)."""
    return eqn.params["format"].value


def target_dtype(eqn: JaxprEqn) -> Any:
    """The dtype a bitcast produces: `dtype` (SparseCore) or `new_dtype` (lax)."""
    params = eqn.params
    return params["new_dtype"] if "new_dtype" in params else params["dtype"]


def packed_dtype(eqn: JaxprEqn) -> Any:
    """The narrow dtype of `pltpu.pack_elementwise` / `unpack_elementwise`."""
    return eqn.params["packed_dtype"]


def unpacked_dtype(eqn: JaxprEqn) -> Any:
    """The dtype `pltpu.unpack_elementwise` produces."""
    return eqn.params["unpacked_dtype"]


def unpack_index(eqn: JaxprEqn) -> int:
    """Which narrow value of each word `pltpu.unpack_elementwise` takes (0: the lowest)."""
    return int(eqn.params["index"])


def rounding_target(eqn: JaxprEqn) -> Any:
    """The dtype `pltpu.stochastic_round` rounds to."""
    return eqn.params["target_dtype"]


# -- the grid, devices, PRNG ---------------------------------------------------------------

def mxu_index(eqn: JaxprEqn) -> int:
    """The MXU an explicit MXU operation (`pltpu.matmul_push_rhs`, `matmul_acc_lhs`,
    `matmul_pop`) uses."""
    return int(eqn.params["mxu_index"])


def staging_register(eqn: JaxprEqn) -> int | None:
    """The staging register `pltpu.matmul_push_rhs` fills or `matmul_acc_lhs` loads the
    RHS from (`load_staged_rhs`; None: the RHS already loaded is used again)."""
    params = eqn.params
    register = params["staging_register"] if "staging_register" in params \
        else params.get("load_staged_rhs")
    return None if register is None else int(register)


def rhs_transposed(eqn: JaxprEqn) -> bool:
    """Whether `pltpu.matmul_push_rhs` transposes the RHS it pushes."""
    return bool(eqn.params.get("transpose", False))


def accumulator_address(eqn: JaxprEqn) -> int:
    """The accumulator address `pltpu.matmul_acc_lhs` adds into or `matmul_pop` pops."""
    return int(eqn.params["acc_addr"])


def grid_axis(eqn: JaxprEqn) -> int:
    """The grid axis of `pl.program_id` / `pl.num_programs`."""
    return int(eqn.params["axis"])


def axis_name(eqn: JaxprEqn) -> Any:
    """The mesh axis name of `lax.axis_index`."""
    return eqn.params["axis_name"]


def slice_sizes(eqn: JaxprEqn) -> tuple[int, ...]:
    """The static sizes of `lax.dynamic_slice` (a ref read, once its state is discharged)."""
    return tuple(int(n) for n in eqn.params["slice_sizes"])


def result_shape(eqn: JaxprEqn) -> tuple[int, ...]:
    """The shape of a primitive that makes a value from nothing (PRNG bits)."""
    return tuple(eqn.params["shape"])


def bit_width(eqn: JaxprEqn) -> int:
    """The width of the bits `random_bits` draws."""
    return int(eqn.params["bit_width"])


# -- nested jaxprs -------------------------------------------------------------------------

def body(eqn: JaxprEqn) -> Any:
    """The body of jit, scan, run_scoped and SparseCore's parallel_loop (`jaxpr`: a
    ClosedJaxpr for jit and scan, an open Jaxpr for run_scoped and parallel_loop)."""
    return eqn.params["jaxpr"]


def maybe_body(eqn: JaxprEqn) -> Any:
    """`body`, or None for a primitive that has none."""
    return eqn.params.get("jaxpr")


def kernel_call_params(eqn: JaxprEqn) -> Params:
    """A kernel equation's params, as the pallas_call lowering is handed them."""
    return eqn.params


def call_body(eqn: JaxprEqn) -> ClosedJaxpr:
    """The body of a closed_call (`call_jaxpr`)."""
    found: ClosedJaxpr = eqn.params["call_jaxpr"]
    return found


def primal_jaxpr(eqn: JaxprEqn) -> ClosedJaxpr:
    """The primal function of a custom_jvp / custom_vjp call."""
    params = eqn.params
    found: ClosedJaxpr = params.get("call_jaxpr") or params["fun_jaxpr"]
    return found


def branches(eqn: JaxprEqn) -> tuple[ClosedJaxpr, ...]:
    """A cond's branches, in index order."""
    return tuple(eqn.params["branches"])


@dataclasses.dataclass(frozen=True)
class WhileLoop:
    """A while loop's parts: operands are cond consts, body consts, then the carry."""

    cond: ClosedJaxpr
    body: ClosedJaxpr
    cond_nconsts: int
    body_nconsts: int


def while_loop(eqn: JaxprEqn) -> WhileLoop:
    params = eqn.params
    return WhileLoop(params["cond_jaxpr"], params["body_jaxpr"], int(params["cond_nconsts"]),
                     int(params["body_nconsts"]))


@dataclasses.dataclass(frozen=True)
class ScanLoop:
    """A scan's parts: operands are consts, the carry, then the scanned inputs."""

    body: ClosedJaxpr
    num_consts: int
    num_carry: int
    length: int
    reverse: bool


def scan_loop(eqn: JaxprEqn) -> ScanLoop:
    params = eqn.params
    return ScanLoop(params["jaxpr"], int(params["num_consts"]), int(params["num_carry"]),
                    int(params["length"]), bool(params["reverse"]))


def nested_with_operands(eqn: JaxprEqn) -> Iterator[tuple[Jaxpr, list[Atom]]]:
    """Each jaxpr nested in the equation, open, with the outer operands its invars receive:
    the equation's last ones (cond branches, jit, loop bodies); a while's condition takes its
    own consts and the carry; a run_scoped body gets the whole operand list (its constvars
    are the outer refs it closes over, its invars the refs it allocates)."""
    params = eqn.params
    for key, value in params.items():
        for sub in value if isinstance(value, tuple) else (value,):
            if isinstance(sub, ClosedJaxpr):
                inner = sub.jaxpr
            elif isinstance(sub, Jaxpr):
                inner = sub
            else:
                continue
            n = len(inner.invars)
            if key == "cond_jaxpr" and "body_nconsts" in params:
                first = params.get("cond_nconsts", 0)
                outer = list(eqn.invars[:first]) + list(eqn.invars[first + params["body_nconsts"]:])
            elif n <= len(eqn.invars):
                outer = list(eqn.invars[len(eqn.invars) - n:])
            else:
                outer = list(eqn.invars)
            yield inner, outer


def bind_params(eqn: JaxprEqn) -> dict[str, Any]:
    """The keyword arguments that rebind the equation's primitive as it was traced."""
    get_bind_params: Callable[..., dict[str, Any]] = eqn.primitive.get_bind_params
    return get_bind_params(eqn.params)


def has_params(eqn: JaxprEqn) -> bool:
    return bool(eqn.params)


def param_values(eqn: JaxprEqn) -> Iterator[Any]:
    """Every parameter value, for passes that look for a kind of value among them."""
    return iter(eqn.params.values())


# -- a jitted call (pjit) ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JitCall:
    """What intercept/outer.py reads of a top-level jitted call's params: its body, its name, and
    which of its (flat) arguments it donates."""

    body: ClosedJaxpr
    name: str
    donated: tuple[bool, ...]

    @property
    def donates(self) -> bool:
        return any(self.donated)


def jit_body(params: Params) -> ClosedJaxpr:
    """The body of a jitted call from its params (no other read: on every jitted call)."""
    found: ClosedJaxpr = params["jaxpr"]
    return found


def jit_call(params: Params) -> JitCall:
    return JitCall(params["jaxpr"], str(params.get("name", "")),
                   tuple(bool(d) for d in params.get("donated_invars", ())))


def with_compiler_options(params: Params, options: Mapping[str, str | bool]) -> Params:
    """A jitted call's params, compiled with XLA compiler `options` as well as its own:
    the passes it disables itself stay disabled beside those `options` disable."""
    merged = dict(params.get("compiler_options_kvs", ()))
    for name, value in options.items():
        already = merged.get(name) if name == "xla_disable_hlo_passes" else None
        merged[name] = f"{already},{value}" if already else value
    return {**params, "compiler_options_kvs": tuple(merged.items())}


# -- prints and checks ---------------------------------------------------------------------

def check_error_tree(eqn: JaxprEqn) -> Any:
    """The pytree of a checkify `check_p`'s error (its operands flattened)."""
    return eqn.params["err_tree"]


def any_check_failed(error: Any) -> bool:
    """Whether a checkify error (`check_error_tree(eqn)` unflattened over its values) holds
    a failed check: any of its predicates (JAX's private `_pred`) set."""
    return any(bool(np.any(p)) for p in error._pred.values())


@dataclasses.dataclass(frozen=True)
class PrintFormat:
    """What `debug_print_p` prints: its format string, the pytree of its arguments, the
    static ones by position, whether the string has placeholders, numpy's print options."""

    fmt: str
    in_tree: Any
    static_args: tuple[tuple[int, Any], ...]
    has_placeholders: bool
    np_printoptions: tuple[tuple[str, Any], ...]


def print_format(params: Params) -> PrintFormat:
    return PrintFormat(params["fmt"], params["in_tree"], tuple(params.get("static_args", ())),
                       bool(params.get("has_placeholders", True)),
                       tuple(params.get("np_printoptions", ())))


def params_of(eqn: JaxprEqn) -> dict[str, Any]:
    """An equation's parameters whole, for a reader here that takes them whole
    (`print_format`)."""
    return eqn.params


def is_plain_conversion(eqn: JaxprEqn) -> bool:
    """Whether a convert_element_type only converts (no parameter beyond the dtype, weak
    type and sharding)."""
    return not set(eqn.params) - {"new_dtype", "weak_type", "sharding"}


def static_text(params: Mapping[str, object]) -> str:
    """The static parameters of a pallas_call as text (its name, debug flag and interpret
    setting left out): equal text, same code on any values."""
    return "\n".join(f"{key}={value}" for key, value in sorted(params.items())
                     if key not in ("debug", "interpret", "name_and_src_info"))
