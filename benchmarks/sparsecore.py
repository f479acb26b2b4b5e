"""SparseCore kernels checked on a CPU (issues 28 and 54.7), races on. Three kernels:

`--kernel gather` (issue 28): 16 vector subcores of one SparseCore gather 4096 rows x 128
lanes (f32) of an 8192-row HBM table by a random index vector. Each subcore gathers its
256 rows L at a time (L = the chip's lanes: 8 on v6e, so 32 indirect DMAs per subcore, 512
in all), each chunk by an indirect DMA through a slice of its VMEM index vector
(`x_hbm.at[idx_v.at[pl.ds(j * L, L)]]`), and writes the chunk out with a plain DMA.

`--kernel gather-reduce` (issue 54.7): a weighted gather-reduce, as a mixture-of-experts
combine or an embedding bag does it: out[t] = sum_k w[t*K + k] * x[idx[t*K + k]] for T
tokens of K = 4 rows each (`--rows` = T*K gathered rows, 4096 by default), over every
vector subcore of the chip (2 SparseCores x 16 on v6e and v7x: 32 workers). Each worker
copies its index and weight slices into VMEM, then per chunk of 8 tokens (32 rows) gathers
the rows by one indirect DMA into one of two VMEM buffers (the next chunk's gather is in
flight while this one is reduced), reduces them in a `plsc.parallel_loop` over groups of L
rows with (L,)-vector multiply-adds (the weights as lanes of one loaded vector), and copies
the chunk's 8 output rows to HBM. `--padding F`: that fraction of the indices is -1,
padding the gather skips (`plsc.Indices(..., ignored_value=-1)`) and the reduction masks
out (weight 0): rows of VMEM that are never written are read, and the call is simulated a
second time with the other fill to tell whether they reach the output.

`--kernel lookup`: 16 subcores look `--rows` ids up in a 1024-entry table in their VMEM,
L ids at a time by `plsc.load_gather` (each lane an element read: bounds, the written
shadow, races), the ids and results in VMEM.

No peer runs them: JAX's interpreters have no SparseCore (`interpret=True` fails) and
without pallas-check a SparseCore kernel does not run on a CPU at all. So the table gives
absolute times: the first call (cold: tracing, the chip compile, the compiled tier, the
simulation; what one test pays), the call's simulation (CallSummary.seconds, the median
over repeats of later calls), the whole later call (wall, and the process's CPU time,
steadier than wall time on a shared host), and the cost per indirect DMA.

    python benchmarks/sparsecore.py [--kernel gather-reduce|lookup] [--rows 4096] [--repeat 3]
                                    [--tpu v6e] [--no-races] [--padding 0.25]

Only pallas-check's public API is used (`pallas_check.checking`, its Run and CallSummary);
tests/test_benchmarks_public.py checks it.
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import pallas_check

TABLE_ROWS, ROWS, D, SUBCORES = 8192, 4096, 128, 16
K, CHUNK_TOKENS = 4, 8  # gather-reduce: rows per token, tokens per gathered chunk


def gather(x, idx):
    """out[i] = x[idx[i]], 16 subcores, one indirect DMA per L rows."""
    rows = idx.shape[0]
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    per_subcore = rows // SUBCORES
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=SUBCORES)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((rows, D), jnp.float32), mesh=mesh,
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


def gather_reduce(x, idx, w, padded=False):
    """out[t] = sum_k w[t*K+k] * x[idx[t*K+k]]: every vector subcore of the chip, a
    double-buffered indirect DMA per 8 tokens, the reduction in a parallel_loop.
    `padded`: an index of -1 is padding, skipped by the gather (its row in VMEM is left
    as it was: never written in the first chunks) and its weight 0, masked out."""
    info = pltpu.get_tpu_info().sparse_core
    lanes, cores, subcores = info.num_lanes, info.num_cores, info.num_subcores
    tokens, d = idx.shape[0] // K, x.shape[1]
    per_worker = tokens // (cores * subcores)  # tokens
    chunk = CHUNK_TOKENS * K  # rows per gather
    chunks = per_worker // CHUNK_TOKENS
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=cores, num_subcores=subcores)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((tokens, d), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((per_worker * K,), jnp.int32),
                              pltpu.VMEM((per_worker * K,), jnp.float32),
                              pltpu.VMEM((2, chunk, d), jnp.float32),
                              pltpu.VMEM((CHUNK_TOKENS, d), jnp.float32),
                              pltpu.SemaphoreType.DMA((2,))])
    def kernel(x_hbm, idx_hbm, w_hbm, o_hbm, idx_v, w_v, rows_v, out_v, sems):
        worker = jax.lax.axis_index("core") * subcores + jax.lax.axis_index("subcore")
        first = worker * per_worker * K
        pltpu.sync_copy(idx_hbm.at[pl.ds(first, per_worker * K)], idx_v)
        pltpu.sync_copy(w_hbm.at[pl.ds(first, per_worker * K)], w_v)

        def gather_chunk(j, slot):
            ids = idx_v.at[pl.ds(j * chunk, chunk)]
            ids = plsc.Indices(ids, ignored_value=-1) if padded else ids
            return pltpu.make_async_copy(x_hbm.at[ids], rows_v.at[slot], sems.at[slot])

        def term(row, weight):
            value = row * weight
            return jnp.where(weight != 0, value, 0.0) if padded else value

        gather_chunk(0, 0).start()

        @pl.loop(0, chunks)
        def _(j):
            slot = j % 2
            gather_chunk(j, slot).wait()

            @pl.when(j + 1 < chunks)
            def _():
                gather_chunk(j + 1, 1 - slot).start()

            @plsc.parallel_loop(0, chunk // lanes)
            def _(g):  # rows [g*L, (g+1)*L) of the chunk: L // K tokens
                wv = w_v[pl.ds(j * chunk + g * lanes, lanes)]
                for u in range(lanes // K):
                    t = g * (lanes // K) + u
                    for c in range(d // lanes):
                        cols = pl.ds(c * lanes, lanes)
                        acc = term(rows_v[slot, t * K, cols], wv[u * K])
                        for k in range(1, K):
                            acc = acc + term(rows_v[slot, t * K + k, cols], wv[u * K + k])
                        out_v[t, cols] = acc

            pltpu.sync_copy(out_v, o_hbm.at[pl.ds(worker * per_worker + j * CHUNK_TOKENS,
                                                  CHUNK_TOKENS)])

    return kernel(x, idx, w)


LOOKUP_TABLE = 1024  # lookup: the VMEM table's entries


def lookup(table, ids):
    """out[i] = table[ids[i]] by `plsc.load_gather` from a table in each subcore's VMEM:
    16 subcores, one L-lane gather per L ids (each lane an element read)."""
    n = ids.shape[0]
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    per_subcore = n // SUBCORES
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=SUBCORES)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((n,), jnp.float32), mesh=mesh,
               compiler_params=pltpu.CompilerParams(needs_layout_passes=False),
               scratch_types=[pltpu.VMEM((LOOKUP_TABLE,), jnp.float32),
                              pltpu.VMEM((per_subcore,), jnp.int32),
                              pltpu.VMEM((per_subcore,), jnp.float32)])
    def kernel(table_hbm, ids_hbm, o_hbm, table_v, ids_v, out_v):
        mine = pl.ds(jax.lax.axis_index("subcore") * per_subcore, per_subcore)
        pltpu.sync_copy(table_hbm, table_v)
        pltpu.sync_copy(ids_hbm.at[mine], ids_v)

        @pl.loop(0, per_subcore // lanes)
        def _(i):
            chunk = pl.ds(i * lanes, lanes)
            out_v[chunk] = plsc.load_gather(table_v, [ids_v[chunk]])

        pltpu.sync_copy(out_v, o_hbm.at[mine])

    return kernel(table, ids)


def _inputs(kernel: str, rows: int, padding: float = 0.0
            ) -> tuple[Callable, tuple, np.ndarray, int]:
    """The kernel, its operands, the expected output and its number of indirect DMAs."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((TABLE_ROWS, D), np.float32)
    idx = rng.integers(0, TABLE_ROWS, rows, dtype=np.int32)
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    if kernel == "gather":
        return gather, (jnp.asarray(x), jnp.asarray(idx)), x[idx], rows // lanes
    if kernel == "lookup":  # `rows` ids; "indirect DMAs": its L-lane gathers
        table = rng.standard_normal(LOOKUP_TABLE).astype(np.float32)
        ids = rng.integers(0, LOOKUP_TABLE, rows, dtype=np.int32)
        return lookup, (jnp.asarray(table), jnp.asarray(ids)), table[ids], rows // lanes
    w = rng.random(rows, np.float32)
    pad = rng.random(rows) < padding
    idx[pad], w[pad] = -1, 0.0
    want = (np.where(pad[:, None], 0.0, x[idx]) * w[:, None]).reshape(rows // K, K, D).sum(1)
    fn = functools.partial(gather_reduce, padded=padding > 0)
    return (fn, (jnp.asarray(x), jnp.asarray(idx), jnp.asarray(w)), want,
            rows // (CHUNK_TOKENS * K))


def measure(kernel: str, rows: int, tpu: str, races: bool, repeat: int,
            padding: float = 0.0) -> dict:
    sim, wall, cpu = [], [], []
    gathers = lanes = 0
    for _ in range(repeat + 1):  # the first is cold (tracing, the compiles, caches)
        with pallas_check.checking(tpu=tpu, races=races, project=False) as run:
            lanes = pltpu.get_tpu_info().sparse_core.num_lanes
            fn, operands, want, gathers = _inputs(kernel, rows, padding)
            started, cpu_started = time.perf_counter(), time.process_time()
            out = jax.block_until_ready(jax.jit(fn)(*operands))
            elapsed = time.perf_counter() - started
            cpu.append(time.process_time() - cpu_started)
        report = run.report
        if report.findings or len(report.calls) != 1:
            raise SystemExit(f"unexpected report: {run!r}\n{run}")
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
        sim.append(report.calls[0].seconds)
        wall.append(elapsed)
    return {"tpu": tpu, "races": races, "lanes": lanes, "gather_dmas": gathers,
            "cold_s": wall[0], "call_s": statistics.median(sim[1:]),
            "wall_s": statistics.median(wall[1:]), "cpu_s": statistics.median(cpu[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", choices=("gather", "gather-reduce", "lookup"),
                        default="gather")
    parser.add_argument("--rows", type=int, default=ROWS, help="rows gathered (default 4096)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tpu", default="v6e")
    parser.add_argument("--no-races", action="store_true")
    parser.add_argument("--padding", type=float, default=0.0,
                        help="gather-reduce: the fraction of indices that are padding (-1)")
    args = parser.parse_args()
    row = measure(args.kernel, args.rows, args.tpu, not args.no_races, args.repeat,
                  args.padding)
    padding = f", {args.padding:.0%} padding" if args.padding else ""
    print(f"# SparseCore {args.kernel}: {args.rows} rows x {D} lanes f32{padding},"
          f" --tpu {row['tpu']} (L={row['lanes']}), races {'on' if row['races'] else 'off'}")
    print(f"# {platform.processor() or platform.machine()}, jax {jax.__version__},"
          f" pallas-check {pallas_check.__version__}, median of {args.repeat}")
    print("| kernel | first call (cold) | call (simulation) | wall (later call)"
          " | CPU (later call) | indirect DMAs | per indirect DMA |")
    print("|---|---|---|---|---|---|---|")
    name = (f"sc-{args.kernel}-{args.rows}" + ("" if args.kernel == "lookup" else f"x{D}")
            + ("-padded" if args.padding else ""))
    print(f"| {name} | {row['cold_s']:.2f} s | {row['call_s']:.3f} s"
          f" | {row['wall_s']:.3f} s | {row['cpu_s']:.3f} s | {row['gather_dmas']}"
          f" | {row['call_s'] / row['gather_dmas'] * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
