"""The simulated TPU (pallas_check/intercept/tpu_info.py) answers what a script asks about its chip as
that chip does, with libtpu's compile-only devices of each generation as the oracle, and
changes nothing else: the devices stay CPU devices, JAX keeps working, and everything is
as before once the simulation ends."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from _cli_worker import run_cli
from pallas_check.config import TpuGeneration
from pallas_check.config.exitcodes import ExitCode
from pallas_check.jaxbridge import jax_mesh_utils, jax_tpu_info
from pallas_check.intercept.tpu_info import CHIPS, simulated_tpu

ROOT = Path(__file__).resolve().parents[2]
WHICH_CHIP = ROOT / "tests" / "scripts" / "which_chip.py"
GENERATIONS = list(TpuGeneration)

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="the oracle is libtpu's compile-only devices")


def _oracle(generation: TpuGeneration) -> tuple[object, object, object]:
    """libtpu's own device of `generation`, and JAX's TPU and SparseCore info for it."""
    from pallas_check.tpu_compile.toolchain import compile_device

    device = compile_device(generation)
    jax_tpu_info.get_tpu_info.cache_clear()
    with jax.default_device(device):
        info = jax_tpu_info.get_tpu_info()
    jax_tpu_info.get_tpu_info.cache_clear()
    return device, info, info.sparse_core


def _asked() -> dict:
    """What a script can ask about its chip before and while its kernels run."""
    device = jax.devices()[0]
    try:
        sparse_core = plsc.get_sparse_core_info()
    except RuntimeError:  # "The current TPU does not have SparseCores"
        sparse_core = None
    return {"kind": device.device_kind, "cores": device.num_cores,
            "local": {d.device_kind for d in jax.local_devices()},
            "array": {d.device_kind for d in jnp.ones(4).devices()},
            "platform": device.platform, "info": pltpu.get_tpu_info(),
            "sparse_core": sparse_core,
            "mesh": pltpu.create_tensorcore_mesh("core").shape["core"],
            "jit": np.asarray(jax.jit(lambda v: v * 2 + 1)(jnp.arange(4.0))).tolist()}


@needs_libtpu
@pytest.mark.parametrize("generation", GENERATIONS, ids=[g.value for g in GENERATIONS])
def test_each_chip_answers_as_libtpu_reports_it(generation):
    device, info, sparse_core = _oracle(generation)
    assert (CHIPS[generation].device_kind, CHIPS[generation].num_cores) == (
        device.device_kind, device.num_cores)
    with simulated_tpu(generation):
        asked = _asked()
    assert asked == {"kind": device.device_kind, "cores": device.num_cores,
                     "local": {device.device_kind}, "array": {device.device_kind},
                     "platform": "cpu", "info": info, "sparse_core": sparse_core,
                     "mesh": device.num_cores, "jit": [1.0, 3.0, 5.0, 7.0]}
    after = jax.devices()[0]
    assert after.device_kind == "cpu" and not hasattr(after, "num_cores")


def test_cores_override_and_nesting_answer_as_the_innermost():
    with simulated_tpu("v5p"):
        assert (jax.devices()[0].device_kind, jax.devices()[0].num_cores) == ("TPU v5", 2)
        with simulated_tpu("v6e,v7x", cores=2):  # the first of a list; --cores 2
            assert jax.devices()[0].device_kind == "TPU v6 lite"
            assert pltpu.get_tpu_info().num_cores == 2 == jax.devices()[0].num_cores
        assert pltpu.get_tpu_info().chip_version.value == "v5p"
        assert pltpu.create_tensorcore_mesh("core").shape["core"] == 2
    assert jax.devices()[0].device_kind == "cpu"
    assert jax_tpu_info.get_device_kind.__module__ != "pallas_check.intercept.tpu_info"


def test_the_api_answers_inside_its_block():
    """`pallas_check.checking(tpu=...)`: the block asks as a script does."""
    import pallas_check

    with pallas_check.checking(tpu="v5p", project=False):
        device = jax.devices()[0]
        asked = (device.device_kind, device.num_cores,
                 pltpu.create_tensorcore_mesh("core").shape["core"],
                 plsc.get_sparse_core_info().num_cores)
    assert asked == ("TPU v5", 2, 2, 4)
    assert jax.devices()[0].device_kind == "cpu"


def test_a_tensorcore_mesh_inside_shard_map_has_the_chips_cores():
    """Inside a shard_map the device is the abstract mesh's, which JAX makes with no core
    count for a CPU device; the same Mesh object under two generations answers each."""
    def cores_times(x):
        return x * pltpu.create_tensorcore_mesh("core").shape["core"]

    for generation, cores in (("v6e", 1), ("v5p", 2)):
        with simulated_tpu(generation):
            mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
            mapped = jax.jit(jax.shard_map(cores_times, mesh=mesh, in_specs=jax.P("x"),
                                           out_specs=jax.P("x")))
            assert np.asarray(mapped(jnp.ones(2))).tolist() == [cores, cores]


def test_cpu_devices_keep_a_cpus_mesh_order():
    """JAX orders a mesh of TPU kinds by the devices' physical coordinates (v7x: 8 devices
    at a time), which CPU devices do not have: under the simulation they keep their order."""
    fakes = [types.SimpleNamespace(id=i, platform="cpu", device_kind="TPU7x")
             for i in range(8)]
    with pytest.raises(AttributeError):  # what JAX does with them unsimulated
        jax_mesh_utils.create_device_mesh((8,), devices=fakes)
    with simulated_tpu("v7x"):
        mesh = jax_mesh_utils.create_device_mesh((2, 4), devices=fakes)
    assert [d.id for d in mesh.flat] == list(range(8))


@pytest.mark.parametrize("command, tpu, expected", [
    ("run", "v6e", "chip: TPU v6 lite cores=1 platform=cpu version=6 rows=16 tile=32"
                   " lanes=128"),
    ("run", "v5p", "chip: TPU v5 cores=2 platform=cpu version=5 rows=8 tile=32 lanes=128"),
    ("diff", "v7x", "chip: TPU7x cores=1 platform=cpu version=7 rows=16 tile=32 lanes=128"),
], ids=["run-v6e", "run-v5p", "diff-jax-interpret-v7x"])
def test_the_cli_answers_before_the_first_call(command, tpu, expected):
    """A script's own question before any pallas_call, and the kernel repository's wrappers
    (device kind, core mesh without num_cores, get_tpu_info), under `run` and under `diff
    --against jax-interpret` (JAX's interpreter is told the same chip; one wrapper, its
    interpreter being slow)."""
    extra = ["--against", "jax-interpret", "--", "per_core"] if command == "diff" else []
    proc = run_cli([command, str(WHICH_CHIP), "--tpu", tpu, *extra], cwd=ROOT, timeout=300)
    assert proc.returncode == ExitCode.CLEAN, proc.stdout + proc.stderr
    assert expected in proc.stdout.splitlines()
    assert "which_chip: outputs match" in proc.stdout
    summary = ("0 of 1 output differ in 1 pallas_call" if command == "diff"
               else "0 findings in 3 pallas_calls")
    assert summary in proc.stdout, proc.stdout
