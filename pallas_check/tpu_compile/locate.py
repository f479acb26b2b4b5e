"""Where a failed compile points in the user's code, and which of the kernel's refs.

- Mosaic quoted an operation: its source location in the call's Mosaic module (mlirloc);
- the lowering has no rule for a primitive: the kernel's first equation of that primitive;
- a ref indexed by an array (Mosaic's words carry no location): the first such access, as
  the simulation finds it (engine/jaxpr/mosaic_limits.py);
- a BlockSpec, or VMEM: the line that made the pallas_call (a BlockSpec has no line of its
  own; it is written in the call).
"""

from __future__ import annotations

from typing import Iterator, Mapping, Protocol, cast

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.call import describe, kernel_of
from pallas_check.jaxbridge.types import Jaxpr, JaxprEqn
from pallas_check.engine.call.describe import kernel_arg_names
from pallas_check.engine.jaxpr.mosaic_limits import kernel_not_lowered
from pallas_check.engine.memory.buffer import memory_space_name
from pallas_check.findings.finding import KernelInfo, SourceFrame
from pallas_check.findings.sourceinfo import code_line, user_frames
from pallas_check.tpu_compile.compiler import CompileOutcome
from pallas_check.tpu_compile.mlirloc import locate


class RecordedCall(Protocol):
    """What placing a failure reads of a recorded call (stage.py's `RecordedCall`, which
    imports this module)."""

    @property
    def params(self) -> dict[str, object]: ...

    @property
    def kernel(self) -> KernelInfo: ...

    @property
    def call_site(self) -> SourceFrame | None: ...


def place(call: RecordedCall, outcome: CompileOutcome) -> tuple[SourceFrame | None, str]:
    """(the frame, the kernel's ref name or "") of a failed compile of `call`."""
    diagnosis = outcome.diagnosis
    assert diagnosis is not None  # (a failed compile's)
    params = call.params
    names = kernel_arg_names(kernel_of(params))
    frame: SourceFrame | None = None
    buffer = ""
    if diagnosis.mosaic and outcome.lowered_ir is not None:
        frame, buffer = _mosaic_place(call, outcome, names)
    elif diagnosis.primitive:
        frame = _primitive_frame(kernel_of(params), diagnosis.primitive)
    elif diagnosis.array_index:
        frame, buffer = _array_index_place(kernel_of(params), names)
    if diagnosis.spec_origin:
        buffer = _spec_buffer(params, diagnosis.spec_origin, names)
    outcome.lowered_ir = None  # the module is large; what it told is kept
    return frame or call.call_site or _kernel_frame(call), buffer


def _mosaic_place(call: RecordedCall, outcome: CompileOutcome, names: list[str]
                  ) -> tuple[SourceFrame | None, str]:
    grid = describe(call.params).grid
    if outcome.lowered_ir is None:  # (`place` asks only when there is one)
        return None, ""
    try:
        where = locate(outcome.lowered_ir, outcome.error_text, len(grid))
    except Exception:  # noqa: BLE001 - an unreadable module: the call's line instead
        return None, ""
    if where is None:
        return None, ""
    buffer = names[where.argument] if where.argument is not None and \
        where.argument < len(names) else ""
    return SourceFrame(where.file, where.line, call.kernel.name,
                       code_line(where.file, where.line)), buffer


def _equations(jaxpr: Jaxpr, outer: SourceFrame | None = None
               ) -> Iterator[tuple[JaxprEqn, SourceFrame | None]]:
    """Every equation, nested ones included, with its user frame (a nested equation of
    JAX's own code, e.g. inside `jnp.sort`'s jit, takes the frame of the one holding it)."""
    for eqn in jaxpr.eqns:
        frames = user_frames(eqn.source_info, limit=1)
        frame = frames[0] if frames else outer
        yield eqn, frame
        for value in eqn_params.param_values(eqn):
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):  # (a jaxpr)
                    yield from _equations(cast(Jaxpr, inner), frame)


def _primitive_frame(jaxpr: Jaxpr, primitive: str) -> SourceFrame | None:
    for eqn, frame in _equations(getattr(jaxpr, "jaxpr", jaxpr)):
        if eqn.primitive.name == primitive and frame is not None:
            return frame
    return None


def _array_index_place(jaxpr: Jaxpr, names: list[str]) -> tuple[SourceFrame | None, str]:
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    found = kernel_not_lowered(inner, names, lambda aval: memory_space_name(
        getattr(aval, "memory_space", None)))
    if found is None or not found.frames:
        return None, ""
    return found.frames[0], found.buffer


def _spec_buffer(params: Mapping[str, object], origin: str, names: list[str]) -> str:
    call = describe(params)
    for k, block in enumerate(call.blocks):
        if block.origin == origin:
            position = call.num_scalars + k
            return names[position] if position < len(names) else ""
    return ""


def _kernel_frame(call: RecordedCall) -> SourceFrame | None:
    kernel = call.kernel
    if not kernel.file:
        return None
    return SourceFrame(kernel.file, kernel.line, kernel.name,
                       code_line(kernel.file, kernel.line))
