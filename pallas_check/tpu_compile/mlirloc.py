"""Where in the user's code the operation Mosaic failed on came from.

Mosaic's error prints the failing operation in MLIR's generic form, without its location.
The Mosaic module the Pallas TPU lowering built (serialized into the call's custom call)
keeps every operation's location, the kernel line it was lowered from. This module reads
that module back and finds the operation that matches the error's: the same operation
(`tpu.vector_load` is how Mosaic names a `vector.load` it has canonicalized) over the same
shapes. A ref operand that is a kernel argument names the buffer.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from typing import TYPE_CHECKING, Iterator

from pallas_check.jaxbridge import mosaic_ir_context

if TYPE_CHECKING:  # jaxlib's MLIR is imported where a module is read
    from jaxlib.mlir import ir

_OP = re.compile(r'"([a-z_]+\.[a-z_0-9.]+)"\(')
_SHAPE = re.compile(r"\b((?:\d+x)+[a-z]+\d*)\b")
_FILE_LINE = re.compile(r'"([^"]+)":(\d+):(\d+)')


@dataclasses.dataclass(frozen=True)
class OpLocation:
    """The source location of a Mosaic operation, and the kernel argument it reads or
    writes when one of its operands is one (its position among the kernel's arguments)."""

    file: str
    line: int
    argument: int | None = None


def failing_operation(message: str) -> tuple[str, frozenset[str]] | None:
    """The operation name and the shapes of the operation quoted in a Mosaic error."""
    marker = message.find("The MLIR operation involved:")
    if marker < 0:
        return None
    # The operation's first line (the SparseCore compiler leaves a blank line before it).
    quoted = next((line for line in message[marker:].split("\n")[1:] if line.strip()), "")
    match = _OP.search(quoted)
    if match is None:
        return None
    return match.group(1), frozenset(_SHAPE.findall(quoted))


def _base(name: str) -> str:
    """`tpu.vector_load` and `vector.load` both as `load`."""
    return name.rsplit(".", 1)[-1].removeprefix("vector_")


def _mosaic_bodies(lowered_ir: ir.Module) -> Iterator[bytes]:
    for op in _walk(lowered_ir.operation):
        if op.name != "stablehlo.custom_call" or "backend_config" not in op.attributes:
            continue
        from jaxlib.mlir import ir

        try:
            config = json.loads(ir.StringAttr(op.attributes["backend_config"]).value)
        except (ValueError, TypeError):
            continue
        body = (config.get("custom_call_config") or {}).get("body")
        if body:
            yield base64.b64decode(body)


def _walk(operation: ir.Operation) -> Iterator[ir.Operation]:
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                yield op.operation
                yield from _walk(op.operation)


def locate(lowered_ir: ir.Module, message: str, leading_scalars: int) -> OpLocation | None:
    """The location of the operation `message` (a Mosaic error) names, found in the Mosaic
    modules of `lowered_ir` (the call's lowered StableHLO module); None when it cannot be
    told. `leading_scalars`: the kernel function's arguments before the kernel's own refs
    (its grid indices)."""
    wanted = failing_operation(message)
    if wanted is None:
        return None
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    name, shapes = wanted
    best: tuple[int, OpLocation] | None = None
    context = mosaic_ir_context()
    with context, ir.Location.unknown():
        context.allow_unregistered_dialects = True
        for body in _mosaic_bodies(lowered_ir):
            module = ir.Module.parse(body)
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(
                module.operation)
            for op in _walk(module.operation):
                if _base(op.name) != _base(name):
                    continue
                found = _FILE_LINE.search(str(op.location))
                if found is None:
                    continue
                text = str(op.get_asm(print_generic_op_form=True)).split("\n", 1)[0]
                score = len(shapes & frozenset(_SHAPE.findall(text)))
                if best is None or score > best[0]:
                    best = (score, OpLocation(found.group(1), int(found.group(2)),
                                              _argument(op, leading_scalars)))
    return best[1] if best else None


def _argument(op: ir.Operation, leading_scalars: int) -> int | None:
    """The kernel argument (a ref) among `op`'s operands: an argument of the kernel
    function's own body (not of a loop's region inside it), past the grid indices."""
    from jaxlib.mlir import ir

    for operand in op.operands:
        try:
            argument: ir.BlockArgument = ir.BlockArgument(operand)
        except (ValueError, TypeError):  # not a block argument
            continue
        parent = argument.owner.owner
        if getattr(parent, "operation", parent).name != "func.func":
            continue
        if argument.arg_number >= leading_scalars:
            return argument.arg_number - leading_scalars
    return None
