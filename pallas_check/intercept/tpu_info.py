"""The simulated TPU: what a script asks about the chip it runs on, answered as `--tpu`'s.

A kernel repository's wrappers ask before any kernel runs: `jax.devices()[0].device_kind`
(JAX's own ragged paged attention picks its tuned block sizes by it; a TPU-only test suite
skips itself without "TPU" in it), `pltpu.create_tensorcore_mesh("core")` without
`num_cores` (the device's `num_cores`), `pltpu.get_tpu_info()`,
`plsc.get_sparse_core_info()`. While a `simulated_tpu` is active, every one of them
answers as the chosen chip does on a real TPU -- the device kind string and the cores per
device as libtpu reports them (`CHIPS`) -- and nothing else changes platform: the devices
stay JAX's CPU devices (`platform == "cpu"`, XLA compiles and runs on the CPU).

How: JAX's `Device` type (one type for every platform) gets `device_kind` and
`num_cores` properties that answer for CPU devices and leave every other device (libtpu's
compile-only TPU devices, which `--compile` uses while this is active) as it is; the
abstract device of a mesh of CPU devices gets the chip's core count (JAX gives a CPU
device none, and `create_tensorcore_mesh` inside a `shard_map` reads it); JAX's
`tpu_info.get_device_kind` / `get_num_device_cores` answer for an abstract mesh made before
the simulation began; JAX's device-mesh orderings for TPU kinds (which read a TPU's
physical coordinates) are not applied to CPU devices, so `jax.make_mesh` orders them as on
a CPU. All of it is installed while the first `simulated_tpu` is active and removed when
the last ends; nested ones (the pytest plugin's for the whole session, a test's own run
inside it) answer as the innermost.

Known gap: JAX's check that string arrays go to CPU devices reads `device_kind` too; a
script that puts string arrays on a device fails while the simulation is active.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Iterator, Sequence

import jax
import numpy as np

from pallas_check.config import TpuGeneration, parse_generations
from pallas_check.jaxbridge import (abstract_device_platform, abstract_device_with_cores,
                                   clear_tpu_info_caches, device_questions, mesh_orderings,
                                   set_device_questions, set_mesh_orderings)


@dataclasses.dataclass(frozen=True)
class Chip:
    """What one generation's JAX device says of itself, as libtpu 0.0.42 reports it (the
    first device of its compile-only topology: `jax.experimental.topologies
    .get_topology_desc("v6e:2x2", "tpu").devices[0]`; tests/intercept/test_tpu_info.py checks this
    table against libtpu)."""

    device_kind: str
    num_cores: int  # TensorCores per JAX device: 2 on v5p (megacore), 1 elsewhere


CHIPS: dict[TpuGeneration, Chip] = {
    TpuGeneration.V5E: Chip("TPU v5 lite", 1),
    TpuGeneration.V5P: Chip("TPU v5", 2),
    TpuGeneration.V6E: Chip("TPU v6 lite", 1),
    TpuGeneration.V7X: Chip("TPU7x", 1),
}
DEVICE_KINDS = {generation: chip.device_kind for generation, chip in CHIPS.items()}


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the simulated chip answers: its device kind and TensorCores per device."""

    generation: TpuGeneration
    device_kind: str
    num_cores: int


def answer_for(generation: TpuGeneration | str, cores: int = 1) -> Answer:
    """The answer of `generation` (the first of a `--tpu` list); `cores` > 1 (`--cores`)
    overrides the chip's own TensorCores per device."""
    chosen = parse_generations(generation)[0]
    chip = CHIPS[chosen]
    return Answer(chosen, chip.device_kind, cores if cores > 1 else chip.num_cores)


_lock = threading.Lock()
_answers: list[Answer] = []  # the active simulations, innermost last
_restore: list[Callable[[], None]] = []  # undoes the patches, while any is active
_questions = [0]  # how many times a simulation answered (`questions`)


def current() -> Answer | None:
    """The innermost active simulation's answer, or None."""
    answers = _answers
    return answers[-1] if answers else None


def _answering() -> Answer | None:
    """`current()`, counted as a question answered when there is one."""
    answer = current()
    if answer is not None:
        _questions[0] += 1
    return answer


def questions() -> int:
    """How many times, so far in this process, something was told the simulated chip (a
    device's kind or cores, JAX's TPU info, a mesh's abstract device). A run during which
    this did not change traced nothing that depends on the chip: another generation's run
    of it would trace the same calls (intercept/generations.py)."""
    return _questions[0]


@contextlib.contextmanager
def simulated_tpu(generation: TpuGeneration | str, cores: int = 1) -> Iterator[Answer]:
    """While active, whatever asks which TPU the script runs on is told `generation` (the
    first of a `--tpu` list) with its TensorCores per device (`cores` > 1: that many)."""
    answer = answer_for(generation, cores)
    with _lock:
        if not _answers:
            _install()
        _answers.append(answer)
        _clear_caches()
    try:
        yield answer
    finally:
        with _lock:
            _answers.remove(answer)
            if not _answers:
                _uninstall()
            _clear_caches()


def _clear_caches() -> None:
    """JAX's caches of what the chip answered, cleared whenever the answer changes:
    `get_tpu_info()` is cached per trace context (not per device), shard_map's manual
    abstract mesh per mesh (the same Mesh object under two generations)."""
    clear_tpu_info_caches()


def _install() -> None:
    for patch in (_patch_device, _patch_jax_tpu_info, _patch_abstract_mesh,
                  _patch_mesh_orderings):
        _restore.append(patch())


def _uninstall() -> None:
    while _restore:
        _restore.pop()()


def _is_cpu(device: object) -> bool:
    return getattr(device, "platform", None) == "cpu"


def _patch_device() -> Callable[[], None]:
    """`device_kind` and `num_cores` of JAX's CPU devices answer as the chip's."""
    device_type = jax.Device  # every platform's (starting no backend to find it)
    kind = device_type.__dict__["device_kind"]
    lookup = device_type.__getattr__  # a TPU device's `num_cores` is one of its attributes
    had_cores = "num_cores" in device_type.__dict__
    saved_cores = device_type.__dict__.get("num_cores")

    def device_kind(self: jax.Device) -> str:
        if _is_cpu(self) and (answer := _answering()) is not None:
            return answer.device_kind
        found: str = kind.__get__(self, device_type)
        return found

    def num_cores(self: jax.Device) -> int:
        if _is_cpu(self) and (answer := _answering()) is not None:
            return answer.num_cores
        cores: int = lookup(self, "num_cores")
        return cores

    device_type.device_kind = property(device_kind, doc=kind.__doc__)
    device_type.num_cores = property(num_cores)

    def restore() -> None:
        device_type.device_kind = kind
        if had_cores:
            device_type.num_cores = saved_cores
        else:
            del device_type.num_cores

    return restore


def _patch_jax_tpu_info() -> Callable[[], None]:
    """JAX's own questions (`get_tpu_info`, the Mosaic lowering's): the default device's
    kind now answers for itself; an abstract mesh of CPU devices made before the simulation
    began still says "cpu", and one made since has no core count (JAX records none for a
    CPU device)."""
    saved = device_questions()
    kind_of, cores_of = saved

    def get_device_kind() -> str:
        found = kind_of()
        answer = _answering() if found == "cpu" else None
        return answer.device_kind if answer is not None else found

    def get_num_device_cores() -> int:
        found = cores_of()
        answer = _answering() if found is None else None
        return answer.num_cores if answer is not None else found

    set_device_questions((get_device_kind, get_num_device_cores))

    def restore() -> None:
        set_device_questions(saved)

    return restore


def _patch_abstract_mesh() -> Callable[[], None]:
    """The abstract mesh of a mesh of CPU devices says the chip's kind and cores
    (`create_tensorcore_mesh` inside a shard_map reads them there; JAX records no core
    count for a CPU device). Made per mesh and answer: JAX keeps one Mesh object per
    devices and axes, and the same mesh may be asked under two generations in a process."""
    mesh_type = jax.sharding.Mesh
    original = mesh_type.__dict__["abstract_mesh"]  # a cached_property: restored as is

    def made(self: jax.sharding.Mesh, answer: Answer | None) -> jax.sharding.AbstractMesh:
        # its device's kind is read now: the answer's
        found: jax.sharding.AbstractMesh = original.func(self)
        device = getattr(found, "abstract_device", None)
        if (answer is None or device is None or abstract_device_platform(device) != "cpu"
                or device.num_cores is not None):
            return found
        # JAX leaves `AbstractMesh.update` unannotated; it returns an AbstractMesh
        updated: jax.sharding.AbstractMesh = found.update(  # type: ignore[no-untyped-call]
            abstract_device=abstract_device_with_cores(device, answer.num_cores))
        return updated

    def abstract_mesh(self: jax.sharding.Mesh) -> jax.sharding.AbstractMesh:
        answer = _answering()
        per_answer: dict[Answer | None, jax.sharding.AbstractMesh] = (
            self.__dict__.setdefault("_pallas_check_abstract_meshes", {}))
        if answer not in per_answer:
            per_answer[answer] = made(self, answer)
        return per_answer[answer]

    # setattr: replacing a JAX class's cached_property, which its stubs type as a method
    setattr(mesh_type, "abstract_mesh", property(abstract_mesh, doc=original.__doc__))

    def restore() -> None:
        setattr(mesh_type, "abstract_mesh", original)

    return restore


# JAX's type of a device-mesh ordering (`mesh_utils.device_kind_handler_dict`'s values):
# the mesh shape and the devices, JAX's options by keyword; None falls back to JAX's own.
_Ordering = Callable[..., "np.ndarray | None"]


def _patch_mesh_orderings() -> Callable[[], None]:
    """JAX orders the devices of a mesh of TPU kinds by their physical coordinates (which
    CPU devices do not have): not for CPU devices, which keep a CPU's order."""
    saved = mesh_orderings()

    def for_tpus_only(handler: _Ordering) -> _Ordering:
        def order(mesh_shape: Sequence[int], devices: Sequence[jax.Device],
                  **kwargs: object) -> np.ndarray | None:
            if devices and _is_cpu(devices[-1]):
                return None  # JAX's own fallback: a CPU's order
            return handler(mesh_shape, devices, **kwargs)

        return order

    set_mesh_orderings({kind: for_tpus_only(handler) for kind, handler in saved.items()})

    def restore() -> None:
        set_mesh_orderings(saved)

    return restore
