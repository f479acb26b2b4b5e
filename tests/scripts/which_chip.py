"""Asks which chip it runs on before any kernel runs, then runs the kernel repository's
wrappers that ask it too (tests/kernel_repo/kernels.py): `pallas-check run|diff --tpu GEN`
must answer as that chip does (tests/intercept/test_tpu_info.py).

Prints one line `chip: KIND cores=N platform=P version=V rows=R tile=T lanes=L` and
`which_chip: outputs match`. Arguments: the wrappers to run (default: all three)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_repo"))
import kernels  # noqa: E402

device = jax.devices()[0]
x = np.arange(32 * 256, dtype=np.float32).reshape(32, 256)
print(f"chip: {device.device_kind} cores={device.num_cores} platform={device.platform}"
      f" version={kernels.tpu_version()} rows={kernels.block_rows()}"
      f" tile={kernels.add_tiles(32, 4)} lanes={pltpu.get_tpu_info().num_lanes}")
runs = {"scale": lambda: kernels.scale_rows(jnp.asarray(x), 2.0),
        "per_core": lambda: kernels.double_per_core(jnp.asarray(x)),
        "add": lambda: kernels.add_tiled(jnp.asarray(x), jnp.asarray(x))}
for name in sys.argv[1:] or runs:
    np.testing.assert_allclose(np.asarray(runs[name]()), x * 2)
print("which_chip: outputs match")
