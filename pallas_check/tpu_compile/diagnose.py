"""A compiler's error as a finding's facts: kind, one readable sentence, error code, and
where in the user's code it points.

What the TPU toolchain says, by where it fails:
- the Pallas TPU lowering (Python): a BlockSpec the TPU cannot tile ("... divisible by 8
  and 128 ..."), a primitive it cannot lower ("Unimplemented primitive ... : sort");
- Mosaic: `E2003: CompileTimeMosaicUnprovenMemoryAccessAlignment: cannot statically prove
  ...` followed by the failing MLIR operation;
- XLA:TPU's memory assignment: `E1001: CompileTimeScopedVmemOom ... Scoped allocation with
  size 23.80M and limit 16.00M` (the kernel's scoped VMEM), or `Allocation (size=X) would
  exceed memory (size=Y) :: ... space=vmem` (VMEM itself).
"""

from __future__ import annotations

import dataclasses
import re

from pallas_check.engine.jaxpr.mosaic_limits import MOSAIC_LOAD_STORE, MOSAIC_REF_SLICE

CODE = re.compile(r"\b(E\d{4})\b")
_SCOPED = re.compile(r"Scoped allocation with size ([\d.]+)([KMG]?) and limit ([\d.]+)([KMG]?)")
_EXCEED = re.compile(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)")
_SPEC = re.compile(r"Block spec for (\S+) in pallas_call .*? has block shape \((.*?)\),"
                   r" array shape \((.*?)\)")
_PRIMITIVE = re.compile(r"Unimplemented primitive in Pallas TPU lowering(?: for \w+)?:"
                        r" ([\w-]+)")
_BLOCKED = re.compile(r"Blocked\(block_size=(\d+)\)")
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
# Mosaic SparseCore (libtpu 0.0.42, v6e: 16 subcores x a 300 KiB VMEM scratch): "E3000:
# CompileTimeSparseCoreAllocationFailure: current allocation offset upper bound (1228799
# words) exceeds the legitimate user allocatable offset upper bound (1048575 words) in memory
# space spmem when allocating 1228800 words".
_SC_ALLOCATION = re.compile(r"SparseCoreAllocationFailure: current allocation offset upper"
                            r" bound \((\d+) words\) exceeds the legitimate user allocatable"
                            r" offset upper bound \((\d+) words\) in memory space (\w+)")
_URL = re.compile(r"\s*See https?://\S+ for more details\.?")


@dataclasses.dataclass
class Diagnosis:
    """What a failed compile means, before it is placed in the user's code."""

    kind: str  # "compile-error" or "vmem-exceeded"
    sentence: str
    code: str | None = None
    spec_origin: str | None = None  # "args[0]" / "outputs": a BlockSpec's operand
    primitive: str | None = None  # a primitive the lowering does not implement
    mosaic: bool = False  # Mosaic quoted the failing MLIR operation
    array_index: bool = False  # a ref indexed by an array (a gather or scatter)
    used_bytes: int | None = None
    available_bytes: int | None = None
    # The bytes are a whole SparseCore's (every subcore's VMEM), not one kernel's scoped VMEM.
    whole_sparsecore: bool = False
    help: str | None = None  # the finding's own help line, where the failure has one


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def _first_sentence(text: str) -> str:
    """The first sentence of `text` on one line, without the "see URL" tail."""
    line = " ".join(_URL.sub("", text).split())
    end = re.search(r"(?<=[a-z0-9)\]'])\. ", line)
    return line[: end.start() + 1] if end else line


def diagnose(message: str) -> Diagnosis:
    """The facts of one compiler error message."""
    code_match = CODE.search(message)
    code = code_match.group(1) if code_match else None
    scoped = _SCOPED.search(message)
    if scoped:
        used, limit = _bytes(*scoped.group(1, 2)), _bytes(*scoped.group(3, 4))
        return Diagnosis("vmem-exceeded", "over the scoped VMEM limit", code,
                         used_bytes=used, available_bytes=limit)
    exceed = _EXCEED.search(message)
    if exceed and "vmem" in message:
        used, capacity = int(exceed.group(1)), int(exceed.group(2))
        return Diagnosis("vmem-exceeded", "over the chip's VMEM", code, used_bytes=used,
                         available_bytes=capacity)
    allocation = _SC_ALLOCATION.search(message)
    if allocation:  # offsets are of 4-byte words, the last one allocatable
        used, capacity = (4 * (int(allocation.group(i)) + 1) for i in (1, 2))
        return Diagnosis("vmem-exceeded", f"over the SparseCore's {allocation.group(3)}"
                         " memory, where the compiler places every subcore's VMEM", code,
                         used_bytes=used, available_bytes=capacity, whole_sparsecore=True)
    spec = _SPEC.search(_BLOCKED.sub(r"\1", message))
    if spec:
        return Diagnosis("compile-error", _first_sentence(message).replace(
            "your block shape", "the block shape") + f" Block shape ({spec.group(2)}) of an"
            f" array of shape ({spec.group(3)}).", code, spec_origin=spec.group(1))
    primitive = _PRIMITIVE.search(message)
    if primitive:
        name = primitive.group(1)
        return Diagnosis("compile-error", f"the Pallas TPU lowering cannot lower `{name}`"
                         f" (unimplemented primitive).", code, primitive=name)
    said = next((words for words in (MOSAIC_LOAD_STORE, MOSAIC_REF_SLICE) if words in message),
                None)
    if said is not None:
        return Diagnosis("compile-error", "a ref indexed by an array of indices (a gather or"
                         " scatter) does not lower: Mosaic takes only scalar and slice"
                         f" indices into a ref (\"{said}\").", code, array_index=True)
    if "Mosaic failed to compile TPU kernel:" in message:
        body = message.split("Mosaic failed to compile TPU kernel:", 1)[1]
        body = body.split("The MLIR operation involved:", 1)[0]
        parts = [p.strip() for p in _first_sentence(body).split(":")]
        text = parts[-1] if parts else body
        if len(parts) >= 3 and CODE.fullmatch(parts[0]):
            text = f"{parts[-1]} ({parts[1]})"
        return Diagnosis("compile-error", f"Mosaic: {text}", code,
                         mosaic="The MLIR operation involved:" in message)
    if "The MLIR operation involved:" in message:  # Mosaic's SparseCore compiler
        first = _first_sentence(message.strip().split("\n\n")[0])
        text = first.split(": ", 1)[1] if first.split(": ", 1)[0].isupper() else first
        return Diagnosis("compile-error", f"Mosaic: {text}", code, mosaic=True)
    return Diagnosis("compile-error", _first_sentence(message.strip().split("\n\n")[0]),
                     code)
