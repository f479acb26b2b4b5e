"""A TensorCore mesh of two cores on a chip with one TensorCore (engine/call/serial.py).

What a TPU v5e did with such kernels in session 30 (hardware/README.md, "Two TensorCores
asked of a v5e"; hardware/probes/cores.py, its results in hardware/chip/v5e/cores/): the
cores' bodies ran one after another, core 0 first (`order`: rows [1, 2, 0, 1]); a signal to
core 1 never arrived (`forward` hung), nor did a wait of core 0 for core 1 end (`backward`
hung); `core_signal_bug` (both cores signal core 0, then each waits on its own semaphore)
finished. The probes' kernels are written out here as the probe has them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode, TpuGeneration, UninitFill
from pallas_check.engine.call.serial import TENSORCORES_PER_CHIP, runs_serially

ROOT = Path(__file__).resolve().parents[3]
CHIP = ROOT / "hardware" / "chip" / "v5e" / "cores"
MESH = pltpu.create_tensorcore_mesh("core", num_cores=2)
ROWS = jax.ShapeDtypeStruct((8, 128), jnp.float32)
X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
MODES = [DmaMode.ON_WAIT, DmaMode.EAGER, DmaMode.RANDOM]


def _config(tpu: str, **kw: object) -> Config:
    mode = kw.pop("dma_mode", DmaMode.ON_WAIT)
    return Config(tpu=tpu, races=True, dma_mode=mode,
                  schedules=20 if mode == DmaMode.RANDOM else 1, **kw)


# -- which chips ------------------------------------------------------------------------


def test_tensorcores_per_chip_are_jaxs():
    chips = {TpuGeneration.V5E: pltpu.ChipVersion.TPU_V5E,
             TpuGeneration.V5P: pltpu.ChipVersion.TPU_V5P,
             TpuGeneration.V6E: pltpu.ChipVersion.TPU_V6E,
             TpuGeneration.V7X: pltpu.ChipVersion("7x")}
    assert set(TENSORCORES_PER_CHIP) == set(TpuGeneration)
    for generation, chip in chips.items():
        assert TENSORCORES_PER_CHIP[generation] == chip.num_physical_tensor_cores_per_chip


@pytest.mark.parametrize("tpu,cores,mesh,serial", [
    ("v5e", 1, 2, True), ("v6e", 1, 2, True), ("v5e,v7x", 1, 4, True),
    ("v7x", 1, 2, False), ("v5p", 1, 2, False), ("v7x,v5e", 1, 2, False),
    ("v5e", 1, 1, False),  # one core: nothing to order
    ("v5e", 2, 2, False),  # --cores 2: the user models a two-core device
])
def test_which_meshes_run_one_core_after_another(tpu, cores, mesh, serial):
    assert runs_serially(Config(tpu=tpu, cores=cores), mesh) is serial


# -- the probe's `order`: one after another, core 0 first ----------------------------------


def _order():
    @pl.kernel(out_type=jax.ShapeDtypeStruct((4, 8, 128), jnp.float32), mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32)])
    def kernel(o_hbm, buf):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(o_hbm.at[1 - core], buf)  # the other core's row, as it is now
        pltpu.sync_copy(buf, o_hbm.at[2 + core])  # ROW
        buf[...] = jnp.full((8, 128), 1.0, jnp.float32) * (core + 1).astype(jnp.float32)
        pltpu.sync_copy(buf, o_hbm.at[core])
    return kernel


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_the_v5e_order_is_the_chips(check, mode):
    """Rows [1, 2, 0, 1] as the chip wrote them (its never-written HBM read as 0: `--uninit
    zero`): core 0 read core 1's row before core 1 ran, core 1 read core 0's after. No
    race: core 1 starts when core 0 has ended. Row 2, read before anything wrote it, is
    the one finding, at core 0's copy of it into row 2 (before: a race on o_hbm, the
    cores ran at once)."""
    chip = np.load(CHIP / "cores_order.npz")["cores.order"]
    assert [float(np.unique(row)[0]) for row in chip] == [1.0, 2.0, 0.0, 1.0]
    result = check(jax.jit(lambda: _order()()),
                   config=_config("v5e", dma_mode=mode, uninit=UninitFill.ZERO))
    np.testing.assert_array_equal(np.asarray(result.value), chip)
    assert [(f.kind.value, f.buffer, f.frames[0].line) for f in result.findings] == [
        ("uninitialized", "buf", _line("ROW"))], [f.message for f in result.findings]
    assert result.findings[0].message.startswith(
        "1024 elements of output o_hbm[2, 0:8, 0:128] depend on memory that was never written")


def test_on_two_tensorcores_the_order_probe_races(check):
    """The same kernel on a v7x: the cores run at once, and core 0's read of core 1's row
    races with core 1's write of it."""
    result = check(jax.jit(lambda: _order()()), config=_config("v7x", uninit=UninitFill.ZERO))
    races = [f for f in result.findings if f.kind.value == "race"]
    assert races and {f.buffer for f in races} == {"o_hbm"}, [f.message for f in races]


@pytest.mark.parametrize("tpu", ["v5e", "v7x"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_core_map_race_ok_is_right_on_either_chip(check, tpu, mode):
    """samples/core_map_race_ok.py gave the right output on the v5e (session 30)."""
    spec = importlib.util.spec_from_file_location("core_map_race_ok",
                                                  ROOT / "samples" / "core_map_race_ok.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = check(jax.jit(module.double), X, config=_config(tpu, dma_mode=mode))
    assert result.findings == [], [f.message for f in result.findings]
    np.testing.assert_array_equal(np.asarray(result.value), np.asarray(X) * 2)


# -- signals between the cores: the probe's `forward` and `backward` ------------------------


def _one_way(signaller: int):
    waiter = 1 - signaller

    @pl.kernel(out_type=ROWS, mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR])
    def kernel(o_hbm, buf, sem):
        core = jax.lax.axis_index("core")

        @pl.when(core == signaller)
        def _():
            pl.semaphore_signal(sem, 1, core_index=waiter)  # SIGNAL

        @pl.when(core == waiter)
        def _():
            pl.semaphore_wait(sem, 1)  # WAIT
            buf[...] = jnp.full((8, 128), 1.0, jnp.float32)
            pltpu.sync_copy(buf, o_hbm)
    return kernel


def _line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# {marker}"))


HELP = ("a TPU {tpu} has one TensorCore: the 2 cores of the TensorCore mesh run one after"
        " another on it, core 0 first, and a signal or DMA to another core of the mesh never"
        " reaches that core{lost}; on a chip with two TensorCores (v4, v5p, v7x) the kernel"
        " can work: check it with `--tpu v7x`, or make it a single-core design")


@pytest.mark.parametrize("tpu", ["v5e", "v6e"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_signal_to_core_1_never_arrives(check, tpu, mode):
    """`forward` hung on the v5e though core 0, the signaller, ran first (before: clean).
    The v6e has one TensorCore too: the same model, unverified on a chip."""
    result = check(jax.jit(lambda: _one_way(0)()), config=_config(tpu, dma_mode=mode))
    (found,) = result.findings
    assert (found.kind.value, found.buffer, found.actor) == ("deadlock", "sem", "core 1")
    assert found.frames[0].line == _line("WAIT")
    assert found.message == ("core 1 waits in a semaphore wait for sem to reach 1 (it is 0),"
                             " and nothing can signal it")
    assert found.help == HELP.format(tpu=tpu, lost=(
        f" (the signal at line {_line('SIGNAL')} from core 0 to core 1 never arrived)"))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_core_0_waiting_for_core_1_never_ends(check, mode):
    """`backward` hung: core 0 runs first, alone, and waits for a core that has not run."""
    result = check(jax.jit(lambda: _one_way(1)()), config=_config("v5e", dma_mode=mode))
    (found,) = result.findings
    assert (found.kind.value, found.buffer, found.actor) == ("deadlock", "sem", "core 0")
    assert found.frames[0].line == _line("WAIT")
    assert found.message == (
        "core 0 waits in a semaphore wait for sem to reach 1 (it is 0), and nothing can"
        " signal it; core 1 never started (on a v5e the mesh's cores run one after another)")
    assert [a.actor for a in found.accesses] == ["core 0"]
    assert found.help == HELP.format(tpu="v5e", lost="")


@pytest.mark.parametrize("signaller", [0, 1])
@pytest.mark.parametrize("tpu,cores", [("v7x", 1), ("v5p", 1), ("v5e", 2)])
def test_on_two_tensorcores_both_directions_work(check, signaller, tpu, cores):
    """A chip with two TensorCores (or `--cores 2`, a user's two-core device) runs the cores
    at once: each direction is clean, its output written."""
    result = check(jax.jit(lambda: _one_way(signaller)()), config=_config(tpu, cores=cores))
    assert result.findings == [], [f.message for f in result.findings]
    np.testing.assert_array_equal(np.asarray(result.value), np.ones((8, 128), np.float32))


def _both_signal_core_0():
    """core_signal_bug's signalling: each core signals core 0, then waits on its own."""
    @pl.kernel(out_type=jax.ShapeDtypeStruct((16, 128), jnp.float32), mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR])
    def kernel(x_hbm, o_hbm, buf, sem):
        core = jax.lax.axis_index("core")
        pl.semaphore_signal(sem, 1, core_index=0)
        pl.semaphore_wait(sem, 1)  # BOTH
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], buf)
        pltpu.sync_copy(buf, o_hbm.at[pl.ds(core * 8, 8)])
    return kernel


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_signal_to_core_0_reaches_the_core_running(check, mode):
    """core_signal_bug finished on the v5e: core 0 is the chip's one TensorCore, running
    core 1 when core 1 signals it, so the signal lands on core 1's own semaphore. On a
    v7x core 0 gets both words and core 1 waits forever."""
    v5e = check(jax.jit(_both_signal_core_0()), X, config=_config("v5e", dma_mode=mode))
    assert v5e.findings == [], [f.message for f in v5e.findings]
    np.testing.assert_array_equal(np.asarray(v5e.value), X)
    v7x = check(jax.jit(_both_signal_core_0()), X, config=_config("v7x", dma_mode=mode))
    kinds = [(f.kind.value, f.actor, f.frames[0].line) for f in v7x.findings]
    assert ("deadlock", "core 1", _line("BOTH")) in kinds, kinds


def _copy_to(core_of):
    """A DMA from each core's VMEM to the VMEM of core `core_of(core)`, then the wait."""
    @pl.kernel(out_type=jax.ShapeDtypeStruct((16, 128), jnp.float32), mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    def kernel(x_hbm, o_hbm, mine, theirs, send_sem, recv_sem):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], mine)
        copy = pltpu.make_async_remote_copy(
            src_ref=mine, dst_ref=theirs, send_sem=send_sem, recv_sem=recv_sem,
            device_id={"core": core_of(core)}, device_id_type=pl.DeviceIdType.MESH)
        copy.start()  # COPY
        copy.wait()  # COPY_WAIT
        pltpu.sync_copy(theirs, o_hbm.at[pl.ds(core * 8, 8)])
    return kernel


def test_a_dma_to_core_1_never_arrives(check):
    """core_swap_ok hung on the v5e: core 0's copy to core 1 goes nowhere, and nothing
    signals core 0's wait."""
    result = check(jax.jit(_copy_to(lambda core: 1 - core)), X, config=_config("v5e"))
    (found,) = result.findings
    assert (found.kind.value, found.actor) == ("deadlock", "core 0")
    assert found.frames[0].line == _line("COPY_WAIT")
    assert found.help == HELP.format(tpu="v5e", lost=(
        f" (the DMA at line {_line('COPY')} from core 0 to core 1 never arrived)"))


def test_a_dma_to_core_0_lands_in_the_senders_own_memory(check):
    """core_swap_bug finished on the v5e with a wrong output: each core's copy to core 0
    lands in its own `theirs`, so each writes back its own rows."""
    result = check(jax.jit(_copy_to(lambda core: 0)), X, config=_config("v5e"))
    assert result.findings == [], [f.message for f in result.findings]
    np.testing.assert_array_equal(np.asarray(result.value), X)
