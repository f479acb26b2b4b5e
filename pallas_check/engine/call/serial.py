"""A TensorCore mesh on a chip with one TensorCore: the mesh's cores run one after another.

`pltpu.create_tensorcore_mesh("core", num_cores=2)` asks for two TensorCores, and a chip
with two (v4 and v5p as a megacore, v7x) runs the two cores' bodies at once. A TPU v5e has
one TensorCore per chip, and session 30 ran such kernels on one (hardware/README.md, "Two
TensorCores asked of a v5e"; the probe hardware/probes/cores.py, its results in
hardware/chip/v5e/cores/, the samples' runs in hardware/chip/v5e/session30_call1.jsonl):

- the bodies ran one after another on the chip's one core, core 0 first (the probe's
  `order`: core 0 saw nothing of core 1's writes, core 1 saw all of core 0's);
- a signal or DMA addressed to core 1 never arrived (the probe's `forward`: core 0 signals
  core 1 and core 1's wait hung, though core 0 ran first; `core_signal_ok` and
  `core_swap_ok` hung where core 0 waits after signalling or copying to core 1, so it did
  not land on core 0 either);
- one addressed to core 0 -- the chip's one TensorCore -- reached the body running it
  (`core_signal_bug` and `core_swap_bug`, where core 1 signals or copies to core 0 and
  then waits on its own semaphore, finished; core 0 had already ended).

So the simulation runs such a mesh's cores one after another per device, each starting
when the one before it has ended (`after`); what a core addresses to core k > 0 of its
mesh is lost, and to core 0 reaches the sender itself (engine/dma/devices.py
`on_serial_chip`). The v6e has one TensorCore per chip too: the same model applies there,
unverified on a chip. Whether a semaphore's count or a scratch buffer's data carries from
one core's body to the next (they may be the same memory) is not known: each core keeps
its own, as on a two-core chip.
"""

from __future__ import annotations

from typing import Callable, Generator, NamedTuple, Protocol, Sequence

from pallas_check.config import Config, TpuGeneration, parse_generations
from pallas_check.engine.events import event_kind
from pallas_check.engine.runtime.scheduler import Actor, Wait
from pallas_check.engine.dma.engine import SyncState
from pallas_check.engine.verdicts import SerialCores

# Physical TensorCores per chip, as JAX's `pltpu.ChipVersion` has them
# (`num_physical_tensor_cores_per_chip`; tests/engine/call/test_serial.py checks this
# table against it). Not the JAX device's `num_cores` (intercept/tpu_info.py): a v7x's
# device reports one core, its chip has two.
TENSORCORES_PER_CHIP = {TpuGeneration.V5E: 1, TpuGeneration.V5P: 2, TpuGeneration.V6E: 1,
                        TpuGeneration.V7X: 2}

# What a core that has not started yet waits for (a scheduler `Wait`'s `what`): a deadlock
# reports such a core as never started (event_data.deadlocked), not as a wait of its own.
SERIAL_START = "start after the core before it"


@event_kind
class SerialStart(NamedTuple):
    """A core of a mesh run one core after another begins now that `after` (the core
    before it on its device) has ended: all `after` did happens before all it does (the
    race checker's edge)."""

    actor: str
    after: str


def runs_serially(config: Config, mesh_cores: int) -> bool:
    """Whether a TensorCore mesh of `mesh_cores` cores runs them one after another: on a
    chip with one TensorCore (the first generation of `--tpu`), unless `--cores N` (N > 1)
    says the device has N (a user modelling a megacore chip is taken at their word)."""
    tpu = parse_generations(config.tpu)[0]
    return mesh_cores > 1 and config.cores <= 1 and TENSORCORES_PER_CHIP[tpu] == 1


def chain(actors: Sequence[Actor], tell: Callable[[SerialStart], None] | None) -> None:
    """One device's cores (in core order) made to run one after another: each begins when
    the one before it has ended."""
    for previous, actor in zip(actors, actors[1:]):
        actor.gen = after(previous, actor.name, actor.gen, tell)


def after(previous: Actor, actor: str, body: Generator[Wait | None, None, object],
          tell: Callable[[SerialStart], None] | None
          ) -> Generator[Wait | None, None, object]:
    """A core's actor that begins only once `previous` (the core before it) has ended;
    `tell`: where the edge between the two goes (None: no listener takes it)."""
    if not previous.done:
        yield Wait(lambda: previous.done, SERIAL_START, (), semaphore=previous.name)
    if tell is not None:
        tell(SerialStart(actor, previous.name))
    return (yield from body)


class SerialCall(Protocol):
    """What a deadlock report reads of the call (engine/call/state.py's CallState)."""

    @property
    def serial_cores(self) -> bool: ...

    @property
    def tpu(self) -> TpuGeneration: ...

    @property
    def cores_per_device(self) -> int: ...

    @property
    def sync(self) -> SyncState: ...


def deadlock_note(call: SerialCall) -> SerialCores | None:
    """What a deadlock's report says of a mesh run one core after another (the cores that
    never started are the deadlock's to fill in: event_data.deadlocked); None for any
    other call."""
    if not call.serial_cores:
        return None
    return SerialCores(call.tpu.value, call.cores_per_device, (), tuple(call.sync.lost))
