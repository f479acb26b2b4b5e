"""The typed parts one simulation of a pallas_call is built from: the call as the script
made it (`CallInputs`) and one run of it (`ScheduleRun`), which simulate.py turns into
`CallState`'s parts: what the simulation is (`Simulation`), where the call runs
(`CallPlace`, with its `SemaphoreLayout`) and what it shares with the runs around it
(`Handover`). Frozen: a part is decided before the state is built, never patched after.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from pallas_check.jaxbridge.call import CallParams
from pallas_check.config import Config
from pallas_check.engine.call.describe import SINGLE_DEVICE, MeshInfo
from pallas_check.engine.call.revisit import Perturbation
from pallas_check.engine.events import Checking, default_checking
from pallas_check.engine.runtime.inflight import InFlight
from pallas_check.engine.seam import AddressProbe
from pallas_check.engine.timeline import MarkSink
from pallas_check.findings.finding import KernelInfo


@dataclasses.dataclass(frozen=True)
class CallInputs:
    """One pallas_call as the script made it, the same for every schedule and fill it is
    simulated under: its parameters and per device its operands, the kernel, the call's
    index, the device mesh, where the outputs' XLA buffers are (one CPU device:
    engine/call/carried.py) and the inputs, by position, that hold memory nobody wrote
    (explore.py)."""

    params: CallParams
    device_operands: Sequence[Sequence[np.ndarray]]
    kernel: KernelInfo
    call_index: int
    mesh: MeshInfo = SINGLE_DEVICE
    addresses: list[int] | None = None
    never_written: frozenset[int] = frozenset()


@dataclasses.dataclass(frozen=True)
class ScheduleRun:
    """One simulation of a call: its options (the seed of its schedule), the fill of
    never-written memory, whether it reports, the listeners it makes, what outlives a call
    (`carried`), the buffers the outputs are simulated in (`results`, one device), the DMA
    ids whose ranges to record (`address_probe`, see explore.py `_one_schedule`), the input
    blocks a re-run deciding output revisits changes (`perturb`) and who is told of the
    running state (`live`)."""

    config: Config
    fill: str
    report: bool
    checking: Checking = dataclasses.field(default_factory=default_checking)
    carried: dict[tuple[object, ...], object] = dataclasses.field(default_factory=dict)
    results: Sequence[np.ndarray] | None = None
    address_probe: AddressProbe | None = None
    perturb: Perturbation | None = None
    live: InFlight | None = None


@dataclasses.dataclass(frozen=True)
class Simulation:
    """What one simulation of a call is: the options it runs under (its seed), the fill of
    never-written memory, the kernel and the call's index, whether it reports (a schedule's
    main run; the re-runs that only compare do not), the listeners it makes, and where
    `--trace` marks go as they happen (None: kept by the timeline until the run ends)."""

    config: Config
    fill: str
    kernel: KernelInfo
    call_index: int
    report: bool
    checking: Checking
    sink: MarkSink | None = None


class SemaphoreLayout(NamedTuple):
    """The operands that are semaphores passed between calls (engine/call/carried.py): the
    inputs and outputs (by position among each), the aliases (output -> input) and the
    number of inputs."""

    inputs: frozenset[int]
    outputs: frozenset[int]
    out_to_in: Mapping[int, int]
    n_in: int


NO_SEMAPHORES = SemaphoreLayout(frozenset(), frozenset(), {}, 0)


@dataclasses.dataclass(frozen=True)
class CallPlace:
    """Where the call runs: its device mesh (shard_map's axes), its core mesh (a core_map /
    pl.kernel call's `mesh`, None for a grid) and collective id (which barrier semaphore
    count it continues), the cores of a device, where the outputs start among the kernel's
    parameters, which operands are semaphores, how many grid steps one device walks, and
    whether the cores of its TensorCore mesh run one after another (engine/call/serial.py)."""

    mesh: MeshInfo = SINGLE_DEVICE
    core_mesh: object | None = None
    collective_id: int | None = None
    cores_per_device: int = 1
    first_output: int = 0
    semaphores: SemaphoreLayout = NO_SEMAPHORES
    grid_steps: int = 0
    serial_cores: bool = False


@dataclasses.dataclass(frozen=True)
class Handover:
    """What the simulation shares with the runs around it: the state that outlives a call
    on a TPU (barrier counts, semaphores passed between calls: engine/call/carried.py), where
    the outputs' XLA buffers are (one CPU device), the DMA ids whose ranges a re-run with
    the other fill records (explore.py), and the perturbation of a re-run deciding output
    revisits (revisit.py)."""

    carried: dict[tuple[object, ...], object] = dataclasses.field(default_factory=dict)
    output_addresses: list[int] | None = None
    address_probe: AddressProbe | None = None
    perturb: Perturbation | None = None
