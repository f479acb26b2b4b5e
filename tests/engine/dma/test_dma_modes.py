"""DMA modes as one strategy (engine/dma/policy.py, issue 27 item 3): each `--dma` mode is a
`DmaPolicy` whose operations (start, a short wait, a wait on one transfer, a DMA carried
in, the kernel's end) are the whole of what the mode means, and the kernel's DMAs and the
BlockSpec pipeline's block copies are both driven by the call's one policy."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.engine.call import state as call_state
from pallas_check.engine.dma import policy as dma_policy
from pallas_check.engine.dma.engine import Dma, SyncState, Transfer
from pallas_check.engine.dma.policy import (DmaPolicy, EagerDmas, OnWaitDmas, RandomDmas,
                                            policy_for)
from pallas_check.engine.runtime.scheduler import Actor, Wait
from pallas_check.intercept.session import Session


class FakeTransfer(Transfer):
    """A transfer that records its events instead of moving data."""

    __slots__ = ("actor_name", "copied", "log")

    def __init__(self, name: str) -> None:
        self.actor_name = name
        self.copied = False
        self.log: list[str] = []

    def complete(self, ctx) -> None:
        self.log.append("complete")
        self.copied = True

    def events(self, ctx):
        yield None
        self.log.append("event")
        self.copied = True


class FakeScheduler:
    def __init__(self) -> None:
        self.spawned: list[Actor] = []

    def spawn(self, actor: Actor) -> None:
        self.spawned.append(actor)


def fake_ctx():
    return types.SimpleNamespace(call=types.SimpleNamespace(scheduler=FakeScheduler()))


def test_every_mode_has_its_policy():
    for mode in DmaMode:
        policy = policy_for(mode)
        assert isinstance(policy, DmaPolicy) and policy.mode == mode
        assert policy_for(mode.value) is policy  # one shared instance per mode
    assert type(policy_for(DmaMode.EAGER)) is EagerDmas
    assert type(policy_for(DmaMode.ON_WAIT)) is OnWaitDmas
    assert type(policy_for(DmaMode.RANDOM)) is RandomDmas
    assert [m for m in DmaMode if policy_for(m).actors] == [DmaMode.RANDOM]


def test_eager_completes_at_start():
    ctx, transfer = fake_ctx(), FakeTransfer("t")
    policy_for(DmaMode.EAGER).started(ctx, transfer)
    assert transfer.log == ["complete"] and not ctx.call.scheduler.spawned
    assert policy_for(DmaMode.EAGER).arrived(ctx, FakeTransfer("carried")) is None


@pytest.mark.parametrize("mode", [DmaMode.EAGER, DmaMode.ON_WAIT])
def test_a_wait_on_one_transfer_completes_it(mode):
    ctx, transfer = fake_ctx(), FakeTransfer("t")
    assert policy_for(mode).await_transfer(ctx, transfer, "pipeline copy wait", ()) is None
    assert transfer.copied and transfer.log == ["complete"]


def test_on_wait_does_nothing_at_start():
    ctx, transfer = fake_ctx(), FakeTransfer("t")
    policy_for(DmaMode.ON_WAIT).started(ctx, transfer)
    assert transfer.log == [] and not transfer.copied and not ctx.call.scheduler.spawned
    assert policy_for(DmaMode.ON_WAIT).arrived(ctx, FakeTransfer("carried")) is None


def test_random_makes_each_transfer_an_actor():
    ctx, transfer = fake_ctx(), FakeTransfer("pipeline copy-in of x_ref block (1, 0)")
    policy = policy_for(DmaMode.RANDOM)
    policy.started(ctx, transfer)
    (actor,) = ctx.call.scheduler.spawned
    assert actor.name == "pipeline copy-in of x_ref block (1, 0)" and transfer.log == []
    wait = policy.await_transfer(ctx, transfer, "pipeline copy wait", ())
    assert isinstance(wait, Wait) and wait.what == "pipeline copy wait"
    assert not wait.ready()
    for _ in actor.gen:  # the scheduler runs the actor: the transfer lands
        pass
    assert transfer.log == ["event"] and wait.ready()
    carried = FakeTransfer("DMA #3 started by core 0")
    arrived = policy.arrived(ctx, carried)
    assert isinstance(arrived, Actor) and arrived.name == "DMA #3 started by core 0"


@pytest.mark.parametrize("mode", list(DmaMode))
def test_drain_completes_what_is_in_flight(mode):
    landed, late = FakeTransfer("a"), FakeTransfer("b")
    landed.copied = True
    policy_for(mode).drain(fake_ctx(), [landed, late])
    assert landed.log == [] and late.log == ["complete"]


# -- which DMAs a short wait lands, on a shared semaphore ------------------------------------


def _semaphore():
    buf = types.SimpleNamespace(id=7, data=np.zeros((), np.int64))
    return (buf, ())


def _dma(dma_id: int, dst_sem, src_sem=None, nbytes: int = 4) -> Dma:
    return Dma(dma_id, None, None, dst_sem, src_sem, nbytes, "core 0", (), None, nbytes)


@pytest.fixture
def landings(monkeypatch):
    """The policy's landings and reads, recorded (and counted on the semaphores) instead
    of moving data."""
    events: list[tuple[str, int]] = []

    def complete(ctx, dma):
        if not dma.read_done and dma.src_sem is not None:
            dma.src_sem[0].data[()] += dma.signal
        dma.read_done = dma.copied = True
        dma.dst_sem[0].data[()] += dma.signal
        events.append(("land", dma.id))

    def dma_read(ctx, dma):
        dma.read_done = True
        dma.src_sem[0].data[()] += dma.signal
        events.append(("read", dma.id))

    monkeypatch.setattr(dma_policy, "complete", complete)
    monkeypatch.setattr(dma_policy, "dma_read", dma_read)
    return events


def test_on_wait_lands_newest_first_until_the_wait_is_met(landings):
    sem, sync = _semaphore(), SyncState()
    for dma_id in (1, 2, 3):
        sync.start(_dma(dma_id, sem))
    policy = policy_for(DmaMode.ON_WAIT)
    policy.land_for(None, sync, sem, 4)
    assert landings == [("land", 3)]
    policy.land_for(None, sync, sem, 8)  # 4 there already: one more
    assert landings == [("land", 3), ("land", 2)]


def test_on_wait_counts_reads_on_a_send_semaphore(landings):
    sem, other, sync = _semaphore(), _semaphore(), SyncState()
    other[0].id = 8
    sync.start(_dma(1, sem))  # lands on sem
    sync.start(_dma(2, other, src_sem=sem))  # reads its source: signals sem
    policy_for(DmaMode.ON_WAIT).land_for(None, sync, sem, 4)
    assert landings == [("read", 2)]  # newest first: DMA 2's read is enough


@pytest.mark.parametrize("mode", [DmaMode.EAGER, DmaMode.RANDOM])
def test_other_modes_land_nothing_at_a_short_wait(landings, mode):
    sem, sync = _semaphore(), SyncState()
    sync.start(_dma(1, sem))
    policy_for(mode).land_for(None, sync, sem, 4)
    assert landings == [] and int(sem[0].data) == 0


# -- one policy for the kernel's DMAs and the pipeline's copies ------------------------------

ROWS = 8


def _kernel_with_both(x, y):
    """A blocked input (pipeline copies) and a manual DMA of an HBM input each step."""

    def kernel(x_ref, y_hbm, o_ref, buf, sem):
        i = pl.program_id(0)
        copy = pltpu.make_async_copy(y_hbm.at[pl.ds(i * ROWS, ROWS)], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = x_ref[...] + buf[...]

    return pl.pallas_call(
        kernel, grid=(2,),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda i: (i, 0)),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((ROWS, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA],
    )(x, y)


@pytest.mark.parametrize("mode", list(DmaMode))
def test_the_calls_policy_drives_dmas_and_pipeline_copies(monkeypatch, mode):
    """The call's one policy sees every start of both kinds of transfer: a new mode
    written as a policy applies to both with no other change."""
    started: list[str] = []
    base = type(policy_for(mode))

    class Recording(base):  # type: ignore[misc, valid-type]
        def started(self, ctx, transfer):
            started.append(type(transfer).__name__)
            super().started(ctx, transfer)

    monkeypatch.setattr(call_state, "policy_for", lambda _mode: Recording())
    x = np.arange(2 * ROWS * 128, dtype=np.float32).reshape(2 * ROWS, 128)
    y = np.ones_like(x)
    session = Session(Config(dma_mode=mode, races=True))
    with session.install():
        out = np.asarray(jax.block_until_ready(_kernel_with_both(x, y)))
    assert session.engine_error is None, session.engine_error
    np.testing.assert_array_equal(out, x + y)
    assert session.findings == []
    # 2 copy-ins, 2 write-backs, 2 kernel DMAs
    assert sorted(started) == ["BlockCopy"] * 4 + ["Dma"] * 2
