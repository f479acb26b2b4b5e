"""A SparseCore gather checked on a CPU (issue 28): 16 vector subcores of one SparseCore
gather 4096 rows x 128 lanes (f32) of an 8192-row HBM table by a random index vector,
races on. Each subcore gathers its 256 rows L at a time (L = the chip's lanes: 8 on v6e,
so 32 indirect DMAs per subcore, 512 in all), each chunk by an indirect DMA through a
slice of its VMEM index vector (`x_hbm.at[idx_v.at[pl.ds(j * L, L)]]`), and writes the
chunk to the output with a plain DMA.

No peer runs it: JAX's interpreters have no SparseCore (`interpret=True` fails) and
without pallas-check a SparseCore kernel does not run on a CPU at all. So the table gives
absolute times: the call's simulation (CallSummary.seconds, the median over repeats), the
whole second call (wall), and the cost per indirect DMA and per DMA of any kind.

    python benchmarks/sparsecore.py [--repeat 3] [--tpu v6e] [--no-races]

Only pallas-check's public API is used (`pallas_check.checking`, its Run and CallSummary);
tests/test_benchmarks_public.py checks it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import pallas_check

TABLE_ROWS, ROWS, D, SUBCORES = 8192, 4096, 128, 16


def gather(x, idx):
    """out[i] = x[idx[i]], 16 subcores, one indirect DMA per L rows."""
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    per_subcore = ROWS // SUBCORES
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=SUBCORES)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((ROWS, D), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((per_subcore,), jnp.int32),
                              pltpu.VMEM((lanes, D), jnp.float32), pltpu.SemaphoreType.DMA])
    def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        base = jax.lax.axis_index("subcore") * per_subcore
        pltpu.sync_copy(idx_hbm.at[pl.ds(base, per_subcore)], idx_v)

        @pl.loop(0, per_subcore // lanes)
        def _(j):
            pltpu.async_copy(x_hbm.at[idx_v.at[pl.ds(j * lanes, lanes)]], rows_v,
                             sem).wait()
            pltpu.sync_copy(rows_v, o_hbm.at[pl.ds(base + j * lanes, lanes)])

    return kernel(x, idx)


def measure(tpu: str, races: bool, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((TABLE_ROWS, D), np.float32))
    idx_np = rng.integers(0, TABLE_ROWS, ROWS, dtype=np.int32)
    idx = jnp.asarray(idx_np)
    sim, wall = [], []
    lanes = 0
    for _ in range(repeat + 1):  # the first is the warm-up (tracing, caches)
        with pallas_check.checking(tpu=tpu, races=races, project=False) as run:
            fn = jax.jit(gather)
            started = time.perf_counter()
            out = jax.block_until_ready(fn(x, idx))
            elapsed = time.perf_counter() - started
            lanes = pltpu.get_tpu_info().sparse_core.num_lanes
        report = run.report
        if report.findings or len(report.calls) != 1:
            raise SystemExit(f"unexpected report: {run!r}\n{run}")
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x)[idx_np])
        sim.append(report.calls[0].seconds)
        wall.append(elapsed)
    sim, wall = sim[1:], wall[1:]
    gathers = ROWS // lanes
    return {"tpu": tpu, "races": races, "lanes": lanes, "gather_dmas": gathers,
            "dmas": 2 * gathers + SUBCORES, "call_s": statistics.median(sim),
            "wall_s": statistics.median(wall)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tpu", default="v6e")
    parser.add_argument("--no-races", action="store_true")
    args = parser.parse_args()
    row = measure(args.tpu, not args.no_races, args.repeat)
    print(f"# SparseCore gather: {SUBCORES} subcores, {ROWS} rows x {D} lanes f32,"
          f" --tpu {row['tpu']} (L={row['lanes']}), races {'on' if row['races'] else 'off'}")
    print(f"# {platform.processor() or platform.machine()}, jax {jax.__version__},"
          f" pallas-check {pallas_check.__version__}, median of {args.repeat}")
    print("| kernel | call (simulation) | wall (2nd call) | indirect DMAs | per indirect DMA"
          " | DMAs in all | per DMA |")
    print("|---|---|---|---|---|---|---|")
    print(f"| sc-gather-4096x128 | {row['call_s']:.3f} s | {row['wall_s']:.3f} s"
          f" | {row['gather_dmas']} | {row['call_s'] / row['gather_dmas'] * 1e6:.0f} us"
          f" | {row['dmas']} | {row['call_s'] / row['dmas'] * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
