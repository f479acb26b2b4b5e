"""pallas-check side by side with JAX's interpreters: times, ratios, peak memory.

    python benchmarks/run.py                 # everything (about 15-25 minutes on 2 CPUs)
    python benchmarks/run.py --quick         # smoke run: small sizes, one repeat
    python benchmarks/run.py --only add,dma  # kernel families or exact keys (add-1024)
    python benchmarks/run.py --json out.json # also write every number
    python benchmarks/run.py --against 0b00ffe   # this tree and a commit, side by side

Not part of the test suite. See benchmarks/README.md for what is measured and how.

Only pallas-check's public API is used (`pallas_check.checking`, its Run and CallSummary,
`pallas_check.simulated_tpu`; tests/test_benchmarks_public.py checks it), so that no
refactor of the package's insides can switch a table off. Whatever a table needs and does
not find is an error that stops the run (BenchmarkBroken), never a table silently left out.

Protocol (in-process pass, one process, interleaved): for repeat r = 1..R, for every
(kernel, configuration): set the configuration up (install a pallas-check session, or
build the call with JAX's `interpret=`), jit the kernel, call it once (warm-up: tracing,
compilation, first-call caches), then time the SECOND call (`block_until_ready`). The
reported time is the median over the repeats. A configuration whose call takes longer
than --slow seconds is sampled only once.

Memory and time caps (fresh-process pass, run first): every configuration also runs in a
fresh subprocess of this script (build the inputs, warm-up call, second call) whose peak
resident set size (`resource.getrusage(RUSAGE_SELF).ru_maxrss`: the process's RSS
high-water mark, JAX, XLA buffers, compiled code, numpy and Python together; tracemalloc
cannot see XLA) is reported, with its growth over the RSS once the inputs exist. A subprocess whose call takes longer than --cap seconds is killed; that
configuration is reported as "timeout >CAP s" and skipped by the in-process pass.

The 4-device ring all-gather needs 4 CPU devices: this script sets
XLA_FLAGS=--xla_force_host_platform_device_count=4 at the top, before JAX is imported,
for the whole process (and its subprocesses); single-device kernels run on device 0.
"""

from __future__ import annotations

import os

# Hermetic numbers: no compiled program of pallas-check's read back from a disk cache
# another run left (what a next process gains from it is measured by suite.py --cache).
# Set PALLAS_CHECK_CACHE_DIR to measure with it.
os.environ.setdefault("PALLAS_CHECK_CACHE_DIR", "off")

_FLAG = "--xla_force_host_platform_device_count=4"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import selectors  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import pallas_check  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "samples"))
import nested_pipeline_ok as nested  # noqa: E402

# ---------------------------------------------------------------------------------------
# Configurations.

PC_OFF, PC_ON, HLO, JAX, JAX_RACES = "pc-off", "pc-on", "hlo", "jax", "jax-races"
MODES = (PC_OFF, PC_ON, HLO, JAX, JAX_RACES)
MODE_TITLES = {
    PC_OFF: "pallas-check",
    PC_ON: "pallas-check races",
    HLO: "JAX HLO interp",
    JAX: "JAX TPU interp",
    JAX_RACES: "JAX TPU interp races",
}


class BenchmarkBroken(RuntimeError):
    """Something this script relies on is missing from pallas-check's public API (or says
    something impossible): the run stops, rather than leave a table out."""


@dataclasses.dataclass
class Bench:
    """One kernel at one size: `build(interpret)` -> (fn, args), fn jittable."""

    key: str
    family: str
    size: int | None
    description: str
    build: Callable[[Any], tuple[Callable[..., Any], tuple]]
    modes: tuple[str, ...] = MODES
    dma_mode: str = "on_wait"  # pallas-check's --dma and JAX's dma_execution_mode
    jax_dma_mode: str | None = None  # JAX's, where it must differ (see all_gather)
    library: bool = False  # a library kernel: no interpret= argument, use contexts
    asks_tpu: bool = False  # asks which TPU it runs on (emit_pipeline): JAX's side needs one
    note: str = ""


def _jax_params(bench: Bench, races: bool) -> Any:
    return pltpu.InterpretParams(detect_races=races,
                                 dma_execution_mode=bench.jax_dma_mode or bench.dma_mode)


@contextlib.contextmanager
def _hlo_pallas_call():
    """Library kernels take no interpret= argument: give every pl.pallas_call
    interpret=True (JAX's HLO interpreter) while the call is traced."""
    original = pl.pallas_call

    def patched(*args: Any, **kwargs: Any) -> Any:
        kwargs["interpret"] = True
        return original(*args, **kwargs)

    pl.pallas_call = patched
    try:
        yield
    finally:
        pl.pallas_call = original


# The families whose every call the compiled tier runs (pallas_check/compiled/): their
# rows run with `tier="compiled"`, compiled from the first (warm-up) call, so the timed
# second call is the steady state a loop of calls reaches under the default `auto`. The
# other rows (all_gather: 4 devices) run on the engine, as `auto` runs them.
COMPILED_FAMILIES = ("add", "dma", "flash", "nested", "paged")


def tier_of(bench: Bench) -> str:
    return "compiled" if bench.family in COMPILED_FAMILIES else "auto"


@contextlib.contextmanager
def configured(bench: Bench, mode: str):
    """Set a configuration up; yields the jitted call, its arguments, and the Python API's
    Run (pallas-check's configurations: its report is there once the block ends)."""
    if mode in (PC_OFF, PC_ON):
        # The project's [tool.pallas-check] and PALLAS_CHECK_* variables do not apply: the
        # configuration is the benchmark's alone.
        with pallas_check.checking(races=mode == PC_ON, dma=bench.dma_mode,
                                   project=False, tier=tier_of(bench)) as run:
            fn, args = bench.build(False)
            yield jax.jit(fn), args, run
        return
    if mode == HLO:
        ctx = _hlo_pallas_call() if bench.library else contextlib.nullcontext()
        interpret: Any = True
    else:
        params = _jax_params(bench, races=mode == JAX_RACES)
        ctx = (pltpu.force_tpu_interpret_mode(params) if bench.library
               else contextlib.nullcontext())
        interpret = params
    # pallas-check answers TPU-kind queries itself; JAX's interpreters see the CPU.
    tpu = pallas_check.simulated_tpu("v5e") if bench.asks_tpu else contextlib.nullcontext()
    with ctx, tpu:
        fn, args = bench.build(None if bench.library else interpret)
        yield jax.jit(fn), args, None


def _block(x: Any) -> Any:
    return jax.block_until_ready(x)


def _cpu_seconds() -> float:
    """CPU time of this process, all threads (XLA's and the host callback's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_sample(bench: Bench, mode: str, on_warm: Callable[[float], None] | None = None,
               on_ready: Callable[[], None] | None = None) -> dict:
    """Warm-up call, then the timed second call, under one configuration."""
    with configured(bench, mode) as (fn, args, run):
        _block(args)
        if on_ready is not None:
            on_ready()  # the inputs exist; nothing has been called yet
        t0 = time.perf_counter()
        _block(fn(*args))
        warm = time.perf_counter() - t0
        if on_warm is not None:
            on_warm(warm)
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        _block(fn(*args))
        seconds = time.perf_counter() - t0
        cpu = _cpu_seconds() - cpu0
    out: dict = {"seconds": seconds, "warmup_seconds": warm, "cpu_seconds": cpu}
    if run is not None:
        if run.report.internal_error:
            raise RuntimeError(run.report.internal_error)
        out["findings"] = len(run.findings)
        out.update(_timed_calls(run, mode))
    return out


def _timed_calls(run: Any, mode: str) -> dict:
    """What pallas-check's report says of the timed call: the engine's own time in its
    pallas_calls' host callbacks and, races on, what race checking covered (each call's
    CallSummary.races). The warm-up and the timed call make the same pallas_calls, so the
    timed call's are the second half of the report's calls."""
    calls = run.calls
    if not calls or len(calls) % 2:
        raise BenchmarkBroken(f"{len(calls)} pallas_call(s) in the report of a warm-up and"
                              " a timed call: expected the same calls twice")
    timed = calls[len(calls) // 2:]
    out: dict = {"engine_seconds": sum(c.seconds for c in timed)}
    if mode == PC_ON:
        costs = [getattr(c, "races", None) for c in timed]
        if not all(cost and "accesses_checked" in cost and "longest_history" in cost
                   for cost in costs):
            raise BenchmarkBroken("races on, but the calls' CallSummary.races say nothing"
                                  f" of what race checking covered ({costs!r}): the"
                                  " race-cost table needs accesses_checked and"
                                  " longest_history")
        out["accesses_checked"] = sum(cost["accesses_checked"] for cost in costs)
        out["max_history"] = max(cost["longest_history"] for cost in costs)
    return out


# ---------------------------------------------------------------------------------------
# Kernels.


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def build_add(grid: int, interpret: Any):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    call = pl.pallas_call(
        _add_kernel, grid=(grid,), in_specs=[spec, spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((8 * grid, 128), jnp.float32),
        interpret=interpret if interpret is not None else False)
    x = jnp.arange(8 * grid * 128, dtype=jnp.float32).reshape(8 * grid, 128)
    return call, (x, 2.0 * x)


def _dma_loop_kernel(x_hbm, o_ref, buf, sem, *, steps: int):
    o_ref[...] = jnp.zeros_like(o_ref)

    def body(i, carry):
        copy = pltpu.make_async_copy(x_hbm.at[i], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] += buf[...]
        return carry

    jax.lax.fori_loop(0, steps, body, 0)


def build_dma(steps: int, interpret: Any):
    call = pl.pallas_call(
        functools.partial(_dma_loop_kernel, steps=steps),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=interpret if interpret is not None else False)
    x = jax.random.normal(jax.random.key(0), (steps, 8, 128), jnp.float32)
    return call, (x,)


def build_flash(interpret: Any, seq: int = 512, block: int = 128):
    """The shipped flash attention forward, causal, b1 h2 d128 (`flash-4096`: seq 4096,
    blocks 512)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    b, h, s, d = 1, 2, seq, 128
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (jax.random.normal(kk, (b, h, s, d), jnp.float32) for kk in keys)
    sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)

    def fn(q, k, v):
        return fa.flash_attention(q, k, v, causal=True, sm_scale=0.125, block_sizes=sizes)

    return fn, (q, k, v)


build_flash_4096 = functools.partial(build_flash, seq=4096, block=512)


NESTED_SIZE, NESTED_BLOCKS = 512, dict(slab=128, block_k=128, block_n=128, cores=2)


def build_nested(interpret: Any):
    """Loss and gradient of sum(tanh(x @ w)): three nested-emit_pipeline matmul calls."""
    fn = nested.make_loss_and_grad(interpret if interpret is not None else False,
                                   **NESTED_BLOCKS)
    return fn, nested.operands(NESTED_SIZE, NESTED_SIZE, NESTED_SIZE)


def build_paged(interpret: Any, batch: int = 4, q_heads: int = 4, kv_heads: int = 2,
                page_size: int = 16, pages_per_seq: int = 8, ppcb: int = 2,
                lengths: tuple[int, ...] = (40, 128, 77, 100)):
    """The shipped paged attention (decode). `paged`: a small case; `paged-2048`: a serving
    size (sequences up to 2048 tokens in pages of 64, 8 pages per compute block)."""
    from jax.experimental.pallas.ops.tpu import paged_attention as pa

    d = 128
    total_pages = batch * pages_per_seq
    keys = jax.random.split(jax.random.key(2), 4)
    k_pages = jax.random.normal(keys[0], (kv_heads, total_pages, page_size, d), jnp.float32)
    v_pages = jax.random.normal(keys[1], (kv_heads, total_pages, page_size, d), jnp.float32)
    page_indices = jax.random.permutation(keys[2], total_pages).astype(jnp.int32).reshape(
        batch, pages_per_seq)
    seq_lengths = jnp.array(lengths, jnp.int32)
    q = jax.random.normal(keys[3], (batch, q_heads, d), jnp.float32)

    def fn(q, kp, vp, seq_lengths, idx):
        return pa.paged_attention(q, kp, vp, seq_lengths, idx, pages_per_compute_block=ppcb,
                                  megacore_mode=None)  # inline_seq_dim: the default

    return fn, (q, k_pages, v_pages, seq_lengths, page_indices)


build_paged_2048 = functools.partial(
    build_paged, batch=8, q_heads=8, kv_heads=2, page_size=64, pages_per_seq=32, ppcb=8,
    lengths=(2048, 1500, 700, 2048, 1024, 33, 1999, 1200))


def build_all_gather(interpret: Any):
    from jax.experimental.pallas.ops.tpu import all_gather as ag

    n = 4
    if len(jax.devices()) < n:
        raise RuntimeError(f"all_gather needs {n} devices (XLA_FLAGS={_FLAG})")
    mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
    x = jax.random.normal(jax.random.key(3), (n * 8, 128), jnp.float32)
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))

    def fn(x):
        return ag.all_gather(x, mesh=mesh, axis_name="x")

    return fn, (x,)


def all_benches(quick: bool) -> list[Bench]:
    add_sizes = (256,) if quick else (256, 1024, 4096)
    dma_sizes = (256,) if quick else (256, 1024)
    out = [Bench(f"add-{g}", "add", g, f"elementwise add, block (8,128) f32, grid {g}",
                 functools.partial(build_add, g)) for g in add_sizes]
    out += [Bench(f"dma-{n}", "dma", n, f"manual-DMA loop, {n} iterations (on_wait)",
                  functools.partial(build_dma, n)) for n in dma_sizes]
    out.append(Bench("flash", "flash", None,
                     "flash attention fwd, causal, b1 h2 s512 d128, blocks 128",
                     build_flash, library=True))
    if not quick:
        out.append(Bench("flash-4096", "flash", 4096,
                         "flash attention fwd, causal, b1 h2 s4096 d128, blocks 512",
                         build_flash_4096, library=True))
    out.append(Bench("nested", "nested", NESTED_SIZE,
                     "nested emit_pipeline matmul, value + grad (fwd + custom_vjp bwd),"
                     f" {NESTED_SIZE}^3 f32, outer grid (2, 2) parallel/arbitrary,"
                     " inner (4, 4) blocks of 128",
                     build_nested, asks_tpu=True))
    out.append(Bench("paged", "paged", None,
                     "paged attention, batch 4, 2 kv heads, 4 q heads, 8 pages of 16",
                     build_paged, library=True))
    if not quick:
        out.append(Bench("paged-2048", "paged", 2048,
                         "paged attention, batch 8, 2 kv heads, 8 q heads, sequences up to"
                         " 2048 in pages of 64, 8 pages per block",
                         build_paged_2048, library=True))
    out.append(Bench("all_gather", "all_gather", None,
                     "4-device ring all-gather, (4*8,128) f32, shard_map",
                     build_all_gather, modes=(PC_OFF, PC_ON, JAX, JAX_RACES), library=True,
                     jax_dma_mode="eager",
                     note="JAX's interpreter in eager DMA mode (on_wait gives NaN on 4"
                          " devices in jax 0.10.2); no HLO interpreter (remote DMAs)"))
    return out


def select(benches: list[Bench], only: str | None) -> list[Bench]:
    if not only:
        return benches
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    chosen = [b for b in benches if b.key in wanted or b.family in wanted]
    unknown = wanted - {b.key for b in benches} - {b.family for b in benches}
    if unknown:
        raise SystemExit(f"--only: unknown kernel(s) {', '.join(sorted(unknown))}; known:"
                         f" {', '.join(b.key for b in benches)}")
    return chosen


# ---------------------------------------------------------------------------------------
# The fresh-process pass: peak memory and time caps.


def _rss_now_kib() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def child_main(key: str, mode: str, quick: bool) -> None:
    """Run one configuration (warm-up + second call); report on stdout as JSON lines."""
    bench = next(b for b in all_benches(quick=False) + all_benches(quick=True)
                 if b.key == key)
    jax.devices()  # backend start-up
    rss: dict = {"start": _rss_now_kib()}

    def ready() -> None:
        rss["inputs"] = _rss_now_kib()
        print(json.dumps({"event": "ready"}), flush=True)

    def warm(seconds: float) -> None:
        print(json.dumps({"event": "warm", "seconds": seconds}), flush=True)

    result = one_sample(bench, mode, on_warm=warm, on_ready=ready)
    result.update(event="done", rss_start_kib=rss["start"], rss_before_kib=rss["inputs"],
                  maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print(json.dumps(result), flush=True)


STARTUP_ALLOWANCE_S = 120.0  # importing JAX, building inputs, in the child


def probe(bench: Bench, mode: str, cap: float) -> dict:
    """One configuration in a fresh subprocess; killed when a call runs past `cap`."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", bench.key, mode]
    errors = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty child never blocks
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + STARTUP_ALLOWANCE_S + cap
    buffer = ""
    result: dict = {}
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                proc.wait()
                return {"timeout": cap}
            if not sel.select(timeout=min(left, 1.0)):
                if proc.poll() is not None:
                    break
                continue
            chunk = proc.stdout.readline()
            if not chunk:
                break
            buffer = chunk.strip()
            try:
                event = json.loads(buffer)
            except ValueError:
                continue
            if event.get("event") == "ready":
                deadline = time.monotonic() + cap  # the warm-up call gets `cap`
            elif event.get("event") == "warm":
                # The warm-up call finished: the timed call gets `cap` from now.
                if event["seconds"] > cap:
                    proc.kill()
                    proc.wait()
                    return {"timeout": cap, "warmup_seconds": event["seconds"]}
                deadline = time.monotonic() + cap
            elif event.get("event") == "done":
                result = event
    finally:
        sel.close()
    proc.wait()
    if not result:
        errors.seek(0)
        err = errors.read().strip().splitlines()
        return {"error": (err[-1] if err else f"exit {proc.returncode}")[:300]}
    return result


def race_cost(results: dict, benches: list[Bench]) -> dict:
    """The race checker's cost per access, per kernel timed with races on. A timed races-on
    row without its accesses is BenchmarkBroken, never a row left out."""
    out = {}
    for b in benches:
        on = results["time"].get(b.key, {}).get(PC_ON)
        if not on or "seconds" not in on:
            continue  # not measured, timed out or failed: the time table says which
        n = on.get("accesses_checked")
        if not n:
            raise BenchmarkBroken(f"{b.key}: races on, but no accesses checked ({n!r})")
        off = results["time"].get(b.key, {}).get(PC_OFF)
        out[b.key] = {
            "accesses": n, "max_history": on["max_history"],
            "us_per_access": on["seconds"] / n * 1e6,
            "extra_us_per_access": (on["seconds"] - off["seconds"]) / n * 1e6
            if off and "seconds" in off else None,
        }
    return out


def require_public_api() -> None:
    """Before anything is measured: the public API has what the tables need (a two-step
    kernel checked with races on says what race checking covered), so that a run cannot
    spend its minutes and then leave a table out."""
    for name in ("checking", "simulated_tpu"):
        if not callable(getattr(pallas_check, name, None)):
            raise BenchmarkBroken(f"pallas_check.{name} is missing from the public API")
    probe_bench = Bench("api-probe", "add", 2, "", functools.partial(build_add, 2))
    if not one_sample(probe_bench, PC_ON).get("accesses_checked"):
        raise BenchmarkBroken("races on, but no accesses checked in a two-step add kernel")


# ---------------------------------------------------------------------------------------
# Report.


def _fmt_s(cell: dict | None) -> str:
    if cell is None:
        return "-"
    if "timeout" in cell:
        return f"timeout >{cell['timeout']:.0f}s"
    if "error" in cell:
        return "error"
    s = cell["seconds"]
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if not a or not b or "seconds" not in a or "seconds" not in b:
        return None
    return a["seconds"] / b["seconds"]


def _fmt_x(x: float | None, lower_bound: bool = False) -> str:
    if x is None:
        return "-"
    return (">" if lower_bound else "") + (f"{x:.1f}×" if x >= 10 else f"{x:.2f}×")


def speedup(slow: dict | None, fast: dict | None) -> tuple[float | None, bool]:
    """How many times faster `fast` is; a lower bound when `slow` timed out."""
    if slow and "timeout" in slow and fast and "seconds" in fast:
        return slow["timeout"] / fast["seconds"], True
    return _ratio(slow, fast), False


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "memory_gib": mem_gib,
            "platform": platform.platform(), "python": platform.python_version(),
            "jax": jax.__version__, "numpy": np.__version__}


def print_report(results: dict, benches: list[Bench], info: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    cells = results["time"]
    t = Table(title="Second-call time (median of repeats; lower is better)")
    t.add_column("kernel")
    for m in MODES:
        t.add_column(MODE_TITLES[m], justify="right")
    t.add_column("pc off / HLO", justify="right")
    t.add_column("TPU interp / pc off", justify="right")
    t.add_column("TPU races / pc races", justify="right")
    for b in benches:
        row = cells.get(b.key, {})
        off_hlo = _ratio(row.get(PC_OFF), row.get(HLO))
        s_jax, lb1 = speedup(row.get(JAX), row.get(PC_OFF))
        s_races, lb2 = speedup(row.get(JAX_RACES), row.get(PC_ON))
        t.add_row(b.key, *[_fmt_s(row.get(m)) if m in b.modes else "n/a" for m in MODES],
                  _fmt_x(off_hlo), _fmt_x(s_jax, lb1), _fmt_x(s_races, lb2))
    console.print(t)

    mem = results.get("memory") or {}
    if mem:
        t = Table(title="Peak RSS (MiB) of a fresh process: inputs built, warm-up call, timed"
                        " call; in brackets: growth over the RSS once the inputs exist")
        t.add_column("kernel")
        for m in MODES:
            t.add_column(MODE_TITLES[m], justify="right")
        for b in benches:
            row = mem.get(b.key, {})
            vals = []
            for m in MODES:
                c = row.get(m)
                if m not in b.modes:
                    vals.append("n/a")
                elif c is None:
                    vals.append("-")
                elif "timeout" in c:
                    vals.append(f"timeout >{c['timeout']:.0f}s")
                elif "error" in c:
                    vals.append("error")
                else:
                    vals.append(f"{c['maxrss_kib'] / 1024:.0f}"
                                f" (+{(c['maxrss_kib'] - c['rss_before_kib']) / 1024:.0f})")
            t.add_row(b.key, *vals)
        console.print(t)

    acc = results.get("race_cost") or {}
    if acc:
        t = Table(title="Race checker cost per access (pallas-check, races on)")
        for col in ("kernel", "accesses checked", "longest history", "time / access",
                    "(on − off) / access"):
            t.add_column(col, justify="right" if col != "kernel" else "left")
        for key, c in acc.items():
            t.add_row(key, str(c["accesses"]), str(c["max_history"]),
                      f"{c['us_per_access']:.1f} µs",
                      f"{c['extra_us_per_access']:.1f} µs"
                      if c.get("extra_us_per_access") is not None else "-")
        console.print(t)

    checks = results.get("targets") or []
    if checks:
        t = Table(title="Targets (issues 4 and 14)")
        for col in ("target", "value", "wanted", "met"):
            t.add_column(col)
        for c in checks:
            t.add_row(c["target"], c["value"], c["wanted"],
                      "-" if c["met"] is None else ("yes" if c["met"] else "NO"))
        console.print(t)
    for b in benches:
        if b.note:
            console.print(f"[dim]{b.key}: {b.note}[/dim]")
    console.print(f"[dim]machine: {info['cpu']}, {info['cpus']} CPUs,"
                  f" {info['memory_gib']:.0f} GiB; Python {info['python']}, jax {info['jax']}"
                  f"[/dim]")


def targets(results: dict) -> list[dict]:
    cells, mem = results["time"], results.get("memory") or {}
    out = []

    def sec(key: str, mode: str) -> dict | None:
        return cells.get(key, {}).get(mode)

    def add(name: str, value: float | None, wanted: str, ok: Callable[[float], bool],
            fmt: str = "{:.2f}", lower_bound: bool = False) -> None:
        out.append({"target": name,
                    "value": "-" if value is None else (">" if lower_bound else "")
                    + fmt.format(value),
                    "wanted": wanted, "met": None if value is None else ok(value),
                    "number": value})

    s, lb = speedup(sec("add-1024", JAX_RACES), sec("add-1024", PC_ON))
    add("add-1024 races: JAX TPU interp races / pallas-check races", s, "≥ 20×",
        lambda v: v >= 20, "{:.1f}×", lb)
    add("add-1024: pallas-check (races off) / HLO interp",
        _ratio(sec("add-1024", PC_OFF), sec("add-1024", HLO)), "≤ 1.0", lambda v: v <= 1.0)
    s, lb = speedup(sec("add-1024", JAX), sec("add-1024", PC_OFF))
    add("add-1024: JAX TPU interp / pallas-check (races off)", s, "≥ 10×", lambda v: v >= 10,
        "{:.1f}×", lb)
    add("races on: time(add-4096) / time(add-1024)",
        _ratio(sec("add-4096", PC_ON), sec("add-1024", PC_ON)), "≤ 4.4", lambda v: v <= 4.4)
    add("races on: time(dma-1024) / time(dma-256)",
        _ratio(sec("dma-1024", PC_ON), sec("dma-256", PC_ON)), "≤ 4.4", lambda v: v <= 4.4)
    # Issue 14: races on, every row faster than JAX's TPU interpreter with races; races off
    # at most 2x the HLO interpreter on a kernel of realistic size.
    for key, row in cells.items():
        s, lb = speedup(row.get(JAX_RACES), row.get(PC_ON))
        if s is not None:
            add(f"{key}: JAX TPU interp races / pallas-check races", s, "> 1×",
                lambda v: v > 1, "{:.2f}×", lb)
    # Kernels of realistic size: flash attention forward at sequence 4096 (the issue's
    # example) and paged attention at a serving size (DMA-bound: one DMA per page).
    for key in ("flash-4096", "paged-2048"):
        add(f"{key}: pallas-check (races off) / HLO interp",
            _ratio(sec(key, PC_OFF), sec(key, HLO)), "≤ 2.0", lambda v: v <= 2.0)
    a = mem.get("add-4096", {}).get(PC_ON)
    for mode in (JAX, JAX_RACES):
        b = mem.get("add-1024", {}).get(mode)
        if not (a and b and "maxrss_kib" in a and "maxrss_kib" in b):
            continue
        add(f"peak RSS: pallas-check races add-4096 / {MODE_TITLES[mode]} add-1024",
            a["maxrss_kib"] / b["maxrss_kib"], "≤ 1.0", lambda v: v <= 1.0,
            f"{{:.2f}} ({a['maxrss_kib'] / 1024:.0f} vs {b['maxrss_kib'] / 1024:.0f} MiB)")
        ga = a["maxrss_kib"] - a["rss_before_kib"]
        gb = b["maxrss_kib"] - b["rss_before_kib"]
        add(f"RSS growth in the calls: same pair ({MODE_TITLES[mode]})", ga / gb, "(≤ 1.0)",
            lambda v: v <= 1.0, f"{{:.2f}} ({ga / 1024:.0f} vs {gb / 1024:.0f} MiB)")
    return out


# ---------------------------------------------------------------------------------------
# Main.


def parse_modes(given: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """--modes as a tuple of known configurations (the default when not given)."""
    modes = default if not given else tuple(m.strip() for m in given.split(","))
    bad = set(modes) - set(MODES)
    if bad:
        raise SystemExit(f"--modes: unknown {', '.join(sorted(bad))}")
    return modes


def compare_against(args: argparse.Namespace) -> int:
    """`--against REV`: this tree and REV measured side by side (benchmarks/against.py)."""
    import against

    if args.quick:
        raise SystemExit("--against measures the full sizes: leave --quick out")
    modes = parse_modes(args.modes, default=(PC_OFF, PC_ON))
    if args.rounds < 1:
        raise SystemExit("--rounds: at least 1")
    benches = select(all_benches(False), args.only)
    configs = [(b.key, m) for b in benches for m in modes if m in b.modes]
    say = functools.partial(print, file=sys.stderr, flush=True)
    try:
        return against.run_against(args.against, configs, args.rounds, args.repeats or 5,
                                   args.limit, args.json, say)
    except against.AgainstError as exc:
        raise SystemExit(f"--against: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated kernel families (add, dma, flash, nested, paged,"
                                   " all_gather) or keys (add-1024, dma-256, ...)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: add-256, dma-256 and the library kernels, 1 repeat,"
                         " 60 s cap")
    ap.add_argument("--repeats", type=int, default=None, help="timed samples (default 5)")
    ap.add_argument("--cap", type=float, default=None,
                    help="seconds one call may take before its configuration is reported"
                         " as a timeout (default 120; --quick 60)")
    ap.add_argument("--slow", type=float, default=10.0,
                    help="configurations whose call takes longer are sampled once")
    ap.add_argument("--modes", help=f"comma-separated subset of {', '.join(MODES)}")
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the fresh-process pass (no peak memory, no time caps)")
    ap.add_argument("--json", metavar="FILE", help="write all numbers to FILE")
    ap.add_argument("--against", metavar="REV",
                    help="measure this tree and git revision REV side by side in the same"
                         " run, paired, several rounds (benchmarks/against.py); modes"
                         " default to pc-off,pc-on")
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --against: paired rounds per kernel family (default 3)")
    ap.add_argument("--limit", type=float, default=1.10,
                    help="with --against: a row slower than this ratio is marked and the"
                         " exit code is 1 (default 1.10)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child[0], args.child[1], args.quick)
        return 0
    if args.against:
        return compare_against(args)

    repeats = args.repeats or (1 if args.quick else 5)
    cap = args.cap or (60.0 if args.quick else 120.0)
    benches = select(all_benches(args.quick), args.only)
    modes = parse_modes(args.modes, default=MODES)
    configs = [(b, m) for b in benches for m in MODES if m in b.modes and m in modes]
    require_public_api()
    info = machine()
    results: dict = {"machine": info, "args": vars(args), "repeats": repeats, "cap_s": cap,
                     "time": {}, "memory": {}}
    say = functools.partial(print, file=sys.stderr, flush=True)

    # Pass 1: fresh processes (peak memory, caps).
    skip: set[tuple[str, str]] = set()
    if not args.no_memory:
        for b, m in configs:
            say(f"[fresh process] {b.key:12s} {m:10s} ...", end=" ")
            res = probe(b, m, cap)
            results["memory"].setdefault(b.key, {})[m] = res
            if "timeout" in res:
                skip.add((b.key, m))
                results["time"].setdefault(b.key, {})[m] = {"timeout": cap}
                say(f"timeout >{cap:.0f}s")
            elif "error" in res:
                if "BenchmarkBroken" in res["error"]:
                    raise BenchmarkBroken(f"{b.key} {m} (fresh process): {res['error']}")
                skip.add((b.key, m))
                results["time"].setdefault(b.key, {})[m] = {"error": res["error"]}
                say(f"error: {res['error']}")
            else:
                say(f"{res['seconds']:.3f} s, peak RSS {res['maxrss_kib'] / 1024:.0f} MiB")

    # Pass 2: this process, interleaved.
    samples: dict[tuple[str, str], list[dict]] = {}
    for r in range(repeats):
        for b, m in configs:
            if (b.key, m) in skip:
                continue
            done = samples.setdefault((b.key, m), [])
            if done and done[0]["seconds"] > args.slow:
                continue
            say(f"[repeat {r + 1}/{repeats}] {b.key:12s} {m:10s} ...", end=" ")
            try:
                res = one_sample(b, m)
            except BenchmarkBroken:
                raise  # this script's own failure: no table may be left out silently
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                results["time"].setdefault(b.key, {})[m] = {"error": msg}
                skip.add((b.key, m))
                say(f"error: {msg}")
                continue
            done.append(res)
            say(f"{res['seconds']:.3f} s")
    for (key, m), got in samples.items():
        if not got:
            continue
        cell = {"seconds": statistics.median(s["seconds"] for s in got),
                "samples": [s["seconds"] for s in got]}
        cell["engine_seconds"] = [s.get("engine_seconds") for s in got]
        for extra in ("findings", "accesses_checked", "max_history"):
            if extra in got[-1]:
                cell[extra] = got[-1][extra]
        results["time"].setdefault(key, {})[m] = cell

    results["race_cost"] = race_cost(results, benches)
    results["targets"] = targets(results)
    print_report(results, benches, info)
    for key, row in results["time"].items():
        for m, c in row.items():
            if c.get("findings"):
                say(f"warning: {key} {m}: pallas-check reported {c['findings']} finding(s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
