"""Probe: what a mesh of two TensorCores (`pltpu.create_tensorcore_mesh("core", num_cores=2)`)
does on a chip with one TensorCore (the v5e).

Session 30's recordings: `samples/core_map_race_ok.py` (each core copies and doubles its own
half, no waiting) returned the right output on a v5e, while `core_signal_ok.py` and
`core_swap_ok.py` (each core signals the other and waits for the other's signal) hung the
chip. Both fit one reading: the chip runs the cores' bodies one after another on its single
core. This probe tells the order:

- `forward`: core 0 signals core 1's semaphore, core 1 waits for it. Completes when core 0
  runs first (or when they run at once).
- `backward`: core 1 signals core 0, core 0 waits. Hangs when core 0 runs first and alone.
- `order`: each core appends its index to an SMEM-free record: core c writes c + 1 into row c
  of the output and copies the other core's row (as written so far) into row 2 + c.

Usage: python cores.py CASE   (one case a process: a hang is ended by the caller's timeout)
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from common import main_guard

MESH = pltpu.create_tensorcore_mesh("core", num_cores=2)
ROWS = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def one_way(signaller: int):
    waiter = 1 - signaller

    @pl.kernel(out_type=ROWS, mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR])
    def kernel(o_hbm, buf, sem):
        core = jax.lax.axis_index("core")

        @pl.when(core == signaller)
        def _():
            pl.semaphore_signal(sem, 1, core_index=waiter)

        @pl.when(core == waiter)
        def _():
            pl.semaphore_wait(sem, 1)
            buf[...] = jnp.full((8, 128), 1.0, jnp.float32)
            pltpu.sync_copy(buf, o_hbm)
    return kernel


def order():
    @pl.kernel(out_type=jax.ShapeDtypeStruct((4, 8, 128), jnp.float32), mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32)])
    def kernel(o_hbm, buf):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(o_hbm.at[1 - core], buf)  # the other core's row, as it is now
        pltpu.sync_copy(buf, o_hbm.at[2 + core])
        buf[...] = jnp.full((8, 128), 1.0, jnp.float32) * (core + 1).astype(jnp.float32)
        pltpu.sync_copy(buf, o_hbm.at[core])
    return kernel


CASES = {"forward": lambda: one_way(0)(), "backward": lambda: one_way(1)(),
         "order": lambda: order()()}


def run(res, names) -> None:
    res.fact("device", num_devices=len(jax.devices()),
             cores=getattr(jax.devices()[0], "num_cores", None))
    for name in names:
        res.case(f"cores.{name}", jax.jit(CASES[name]))


if __name__ == "__main__":
    names = sys.argv[1:] or ["forward", "order"]
    main_guard(lambda r: run(r, names), "cores_" + "_".join(names))
