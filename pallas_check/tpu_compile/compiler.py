"""One call compiled for one TPU generation: ok with its VMEM footprint, or why not.

The call is re-bound exactly as the script made it (kernel, grid, BlockSpecs, scratch,
compiler params) on `ShapeDtypeStruct`s of its operands placed on a compile-only device of
the generation, lowered with that device as JAX's default device (the Pallas TPU lowering
asks it which chip it targets) and compiled. A call that ran inside a shard_map is compiled
inside one over as many chips of the topology, every operand at its per-device shape.
Outcomes are cached per (call, shapes, mesh, generation) for the whole process.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Hashable

from pallas_check.config import TpuGeneration
from pallas_check.findings.finding import JsonObject
from pallas_check.config.environment import debug_requested
from pallas_check.engine.call import describe
from pallas_check.engine.call.describe import sparsecore_mesh
from pallas_check.engine.jaxpr.mosaic_limits import foreign_compiler_params
from pallas_check.jaxbridge import call as call_bridge
from pallas_check.jaxbridge import export
from pallas_check.tpu_compile import outcome_cache, remote, toolchain
from pallas_check.tpu_compile.remote import scoped_use
from pallas_check.tpu_compile.diagnose import Diagnosis, diagnose
# One reckoning of capacities and limits, shared with the engine (engine/call/footprint.py).
from pallas_check.engine.call.footprint import (
    MIB,
    SCOPED_VMEM_LIMIT,
    SPARSECORE_VMEM_CAPACITY,
    VMEM_CAPACITY,
    Allocation,
    allocations,
    scoped_limit,
    scratch_bytes,
    sparsecore_allocations,
)

if TYPE_CHECKING:  # JAX and its MLIR are imported where a call is compiled
    import jax
    from jaxlib.mlir import ir

# A pallas_call's params (the primitive's: JAX's values, passed on to the bridge).
Params = dict[str, object]
# One device's operands: ((shape, dtype name), ...).
OperandAvals = tuple[tuple[tuple[int, ...], str], ...]
# The named mesh axes of a shard_map, (name, size) pairs; empty outside one.
MeshAxes = tuple[tuple[Hashable, int], ...]


@dataclasses.dataclass(frozen=True)
class Raised:
    """The exception the chip's toolchain raised for a call: its class and arguments, so
    that the user's program can be given a fresh one of the same class and message at each
    call that fails (intercept/chip.py), as a TPU raises it again at each."""

    cls: type[Exception]
    args: tuple[object, ...]

    def exception(self) -> Exception:
        """A new instance: the class called with the arguments (jaxlib's
        `JaxRuntimeError` keeps its message only so), or, where that does not give back
        those arguments (Pallas's `VerificationError` prefixes its message again), made
        without the class's `__init__`."""
        try:
            made = self.cls(*self.args)
            if made.args == self.args:
                return made
        except Exception:  # noqa: BLE001 - a class that takes other arguments
            pass
        exc = self.cls.__new__(self.cls, *self.args)
        Exception.__init__(exc, *self.args)
        return exc

    @property
    def name(self) -> str:
        return self.cls.__name__


@dataclasses.dataclass
class CompileOutcome:
    """One call for one generation."""

    generation: TpuGeneration
    seconds: float
    diagnosis: Diagnosis | None = None  # None: it compiled
    error_text: str = ""  # the compiler's whole message (PALLAS_CHECK_DEBUG)
    lowered_ir: ir.Module | None = None  # the lowered module, when lowering got that far
    scoped_bytes: int | None = None  # the compiler's scoped VMEM use, when it compiled
    scoped_limit: int = 0
    scratch_bytes: int = 0
    capacity: int = 0
    allocations: tuple[Allocation, ...] = ()
    raised: Raised | None = None  # what the toolchain raised, when it failed
    crashed: bool = False  # libtpu's compiler died on it (tpu_compile/remote.py)

    @property
    def ok(self) -> bool:
        return self.diagnosis is None

    @property
    def used_bytes(self) -> int | None:
        """VMEM the kernel takes: the compiler's scoped VMEM, its scratch operands included
        (libtpu 0.0.42: 10 MiB of live scratch and a 5 MiB block use 15.7 MiB of scoped
        VMEM; a scratch operand the kernel never reads is dropped by Mosaic and takes
        none)."""
        if self.diagnosis is not None and self.diagnosis.used_bytes is not None:
            return self.diagnosis.used_bytes
        if self.scoped_bytes is None:
            return None
        return self.scoped_bytes

    def summary(self) -> JsonObject:
        """The call's line in a report for this generation."""
        diagnosis = self.diagnosis  # (None: ok)
        return {"status": "ok" if diagnosis is None else diagnosis.kind,
                "vmem_used_bytes": self.used_bytes,
                "vmem_scoped_bytes": self.scoped_bytes,
                "vmem_scoped_limit_bytes": self.scoped_limit,
                "vmem_scratch_bytes": self.scratch_bytes,
                "vmem_capacity_bytes": self.capacity,
                "compile_seconds": round(self.seconds, 3),
                "error_code": None if diagnosis is None else diagnosis.code}


_cache: dict[tuple[Hashable, ...], CompileOutcome] = {}
_cache_lock = threading.Lock()


def _params_key(params: Params) -> Hashable:
    try:
        key = tuple(sorted(params.items()))
        hash(key)
        return key
    except TypeError:  # an unhashable parameter: the call object itself
        return ("id", id(params))


def compile_call(params: Params, avals: OperandAvals, mesh_axes: MeshAxes,
                 generation: TpuGeneration, meanwhile: Callable[[], None] | None = None
                 ) -> CompileOutcome:
    """Compile the call (its pallas_call params, operand (shape, dtype) pairs, shard_map
    axes) for `generation`; cached."""
    key = (_params_key(params), avals, mesh_axes, generation)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    outcome = _compile(params, avals, mesh_axes, generation, meanwhile)
    with _cache_lock:
        _cache.setdefault(key, outcome)
    return outcome


def _bound(params: Params) -> Callable[..., object]:
    """The call re-bound for the TPU compiler: a SparseCore kernel as the `mpmd_map` that
    `pl.kernel` made (its TPU lowering picks the SparseCore kernel type), any other as the
    pallas_call with interpret off."""

    if sparsecore_mesh(params) is not None:
        return call_bridge.rebound_mpmd(params)
    return call_bridge.rebound(params)


def _placed(params: Params, avals: OperandAvals, mesh_axes: MeshAxes, generation: TpuGeneration
            ) -> tuple[Callable[..., object], list[jax.ShapeDtypeStruct], jax.Device]:
    """The function to compile, its arguments as placed ShapeDtypeStructs, the device."""
    import jax
    import numpy as np

    fn = _bound(params)
    if not mesh_axes:
        device = toolchain.compile_device(generation)
        sharding: jax.sharding.Sharding = jax.sharding.SingleDeviceSharding(device)
        return fn, [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in avals], device
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    names = tuple(name for name, _ in mesh_axes)
    sizes = tuple(size for _, size in mesh_axes)
    devices = toolchain.compile_devices(generation, math.prod(sizes))
    mesh = Mesh(np.array(devices[: math.prod(sizes)]).reshape(sizes), names)
    # Every operand is a device's block: replicated over the mesh, each device has it at
    # its per-device shape (values do not matter to a compiler).
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=tuple(PartitionSpec() for _ in avals),
                           out_specs=PartitionSpec(), check_vma=False)
    sharding = NamedSharding(mesh, PartitionSpec())
    return (mapped, [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in avals],
            devices[0])


def _compile(params: Params, avals: OperandAvals, mesh_axes: MeshAxes,
             generation: TpuGeneration, meanwhile: Callable[[], None] | None = None
             ) -> CompileOutcome:
    import jax

    outcome = (_sparsecore_outcome(params, generation) if sparsecore_mesh(params) is not None
               else CompileOutcome(generation, 0.0,
                                   scoped_limit=scoped_limit(params, generation),
                                   scratch_bytes=scratch_bytes(params),
                                   capacity=VMEM_CAPACITY[generation],
                                   allocations=tuple(allocations(params))))
    # Where the call is placed is ours to get right: a failure there is pallas-check's
    # (raised, exit 4), not a finding about the user's kernel.
    started = time.perf_counter()
    structure = outcome_cache.structure_key(params, avals, mesh_axes)
    known = outcome_cache.read(structure, generation.value)
    if known is not None:  # built before (another run): neither lowered nor compiled now
        outcome.scoped_bytes = known
        outcome.seconds = time.perf_counter() - started
        return outcome
    fn, args, device = _placed(params, avals, mesh_axes, generation)
    jitted = jax.jit(fn)
    lowered_text = ""
    lowered = None
    try:
        with jax.default_device(device):
            # Exported for the compile worker first: its module is the key, so the call
            # is lowered once (the Pallas TPU lowering: tens of milliseconds a call).
            blob, lowered_text = _exported(jitted, args)
            if blob is None:  # (the worker cannot take it: lowered and compiled here)
                lowered = jitted.lower(*args)
                lowered_text = lowered.as_text()
            # The disk's verdict on this exact module (tpu_compile/outcome_cache.py).
            known = outcome_cache.read(lowered_text, generation.value)
            if known is not None:
                outcome.scoped_bytes = known
                outcome.seconds = time.perf_counter() - started
                outcome_cache.write(structure, generation.value, known)
                return outcome
            answer = (None if blob is None
                      else _in_worker(blob, params, mesh_axes, generation, meanwhile))
            if answer is None or answer.error_class is not None or answer.crashed:
                # The module a refusal is located in (tpu_compile/locate.py), and the
                # compile here when the worker did not take the call.
                lowered = lowered if lowered is not None else jitted.lower(*args)
                outcome.lowered_ir = lowered.compiler_ir("stablehlo")
            if answer is None:
                assert lowered is not None  # (lowered just above)
                text = toolchain.quietly(lowered.compile).as_text()
                # (None where the backend gives no text: the use is unknown)
                answer = remote.Answer(scoped_bytes=None if text is None else scoped_use(text))
    except Exception as exc:  # noqa: BLE001 - the compiler's verdict on the user's kernel
        answer = remote.Answer(error_class=type(exc), error_args=tuple(exc.args),
                               message=str(exc))
    outcome.seconds = time.perf_counter() - started
    return _settled(outcome, answer, params, lowered_text, structure)


def _exported(jitted: Callable[..., object], args: list[jax.ShapeDtypeStruct]
              ) -> tuple[bytes | None, str]:
    """The call exported for the compile worker and its module's key; (None, "") where it
    cannot go there (the worker is off, or `jax.export` cannot carry the call: a lowering
    that refuses the kernel raises again, as the user's, from `jitted.lower`)."""
    if not remote.enabled:
        return None, ""
    try:
        return export.exported_for_tpu_keyed(jitted, args)
    except Exception as exc:  # noqa: BLE001 - ours: the call is compiled here, as before
        _compiled_here(f"jax.export cannot carry the call ({type(exc).__name__}: {exc})")
        return None, ""


def _in_worker(blob: bytes, params: Params, mesh_axes: MeshAxes, generation: TpuGeneration,
               meanwhile: Callable[[], None] | None = None) -> remote.Answer | None:
    """The exported call compiled in the compile worker (tpu_compile/remote.py), where
    libtpu's compiler aborting cannot end this process, `meanwhile` run here as it
    compiles; None where the worker cannot run (the caller compiles it itself)."""
    devices = math.prod(size for _, size in mesh_axes) if mesh_axes else 1
    name = describe.kernel_info(params).name
    job = remote.Job(blob, toolchain.topology_name(generation, devices), tuple(mesh_axes),
                     abort=remote.abort_requested(name))
    try:
        return remote.compile_in_worker(job, meanwhile)
    except remote.Unavailable as exc:
        _compiled_here(str(exc))
        return None


def _compiled_here(why: str) -> None:
    """A call compiled in this process (an abort there ends it): said under
    PALLAS_CHECK_DEBUG, for a bug report."""
    if debug_requested():
        sys.stderr.write(f"pallas-check: the TPU compile ran in this process: {why}\n")


def _settled(outcome: CompileOutcome, answer: remote.Answer, params: Params,
             lowered_text: str, structure: str = "") -> CompileOutcome:
    """The outcome of what the compile came to; a success kept on disk."""
    if answer.crashed:
        return _crashed(outcome, answer)
    if answer.error_class is not None:
        name = answer.error_class.__name__
        outcome.error_text = f"{name}: {answer.message}"
        outcome.diagnosis = diagnose(answer.message or _unsaid(params, name))
        outcome.raised = Raised(answer.error_class, answer.error_args)
        return outcome
    outcome.lowered_ir = None  # kept only to place a failure
    outcome.scoped_bytes = answer.scoped_bytes
    if outcome.scoped_bytes is not None and lowered_text:
        for key in (lowered_text, structure):
            if key:
                outcome_cache.write(key, outcome.generation.value, outcome.scoped_bytes)
    return outcome


def _crashed(outcome: CompileOutcome, answer: remote.Answer) -> CompileOutcome:
    """libtpu's compiler died compiling the call (in the worker): a compile-error with its
    last words; the program is given ChipCompilerAborted (a TPU host's process ends)."""
    said = answer.last_words
    if answer.signal_name == "SIGABRT":
        sentence = f"libtpu's compiler aborted: {said or 'no message'}"
    else:
        sentence = f"libtpu's compiler died of {answer.signal_name}" + (f": {said}" if said
                                                                        else "")
    generation = outcome.generation.value
    outcome.crashed = True
    outcome.error_text = sentence
    outcome.diagnosis = Diagnosis(
        "compile-error", sentence,
        help=(f"libtpu {toolchain.libtpu_version()}'s compiler crashes on this kernel: a TPU"
              " host compiling it with this libtpu crashes too, so it cannot run there."
              " Change the kernel, or try another libtpu. pallas-check compiled it in a"
              " worker process, which the crash ended, and raises"
              f" {remote.ChipCompilerAborted.__name__} at the call instead."))
    outcome.raised = Raised(remote.ChipCompilerAborted, (
        f"{sentence} (compiling this pallas_call for {generation}): on a TPU host the"
        " process ends here; pallas-check raises this error instead",))
    return outcome


def _unsaid(params: Params, error_name: str) -> str:
    """What a failure without a message means: the TPU lowering's assertion on compiler
    params of another backend (engine/jaxpr/mosaic_limits.py says which), or its type."""
    refused = foreign_compiler_params(params)
    if refused is not None:
        return refused.message
    return f"{error_name} in the Pallas TPU lowering (no message)"


def _sparsecore_outcome(params: Params, generation: TpuGeneration) -> CompileOutcome:
    """A SparseCore kernel's footprint is one vector subcore's VMEM, against its capacity
    (no scoped limit of its own is known: the capacity stands for it)."""
    capacity = SPARSECORE_VMEM_CAPACITY.get(generation, 0)
    found = tuple(sparsecore_allocations(params))
    return CompileOutcome(generation, 0.0, scoped_limit=capacity, capacity=capacity,
                          scratch_bytes=sum(a.nbytes for a in found if a.what == "scratch"),
                          allocations=found)


def cached_outcome(params: Params, avals: OperandAvals, mesh_axes: MeshAxes,
                   generation: TpuGeneration) -> CompileOutcome | None:
    """The outcome of a compile this process already made of the call, or None (no
    compile is started: the simulation asks what the call's lowering found)."""
    with _cache_lock:
        return _cache.get((_params_key(params), avals, mesh_axes, generation))
