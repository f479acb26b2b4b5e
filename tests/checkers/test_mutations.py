"""Mutation tests for the detectors: one known defect per mutant, found where it was made.

Seven CORRECT kernels are built by factories below. Each factory takes parameters that
inject exactly one defect (no source text is edited); the mutable statements carry a
`# MUT:<name>` marker so the test knows their line numbers.

Every unmutated kernel must give 0 findings with `races=True`, under both DMA modes (and
with 2 cores where the kernel has a parallel axis). Every mutant must give its expected
finding kind at its anchor line, under both DMA modes:

| mutation               | kernel            | run with           | kind             | anchor line (`MUT:`)      |
|------------------------|-------------------|--------------------|------------------|---------------------------|
| drop-dma-wait          | double-buffer DMA |                    | dma-not-waited   | a `.start()` (dma-start-*)|
| dma-into-slot-read     | double-buffer DMA | races              | race             | next `.start()`           |
| shift-index-map        | elementwise (in)  |                    | out-of-bounds    | the shifted index_map     |
| shift-index-map        | elementwise (out) |                    | out-of-bounds    | the shifted index_map     |
| shift-index-map        | elementwise (out) |                    | unwritten-output | the kernel's `def`        |
| shift-index-map        | matmul (x)        |                    | out-of-bounds    | the shifted index_map     |
| remove-init            | matmul            |                    | uninitialized    | the `acc += ...` read     |
| remove-init            | reduction         |                    | uninitialized    | the `o += ...` read       |
| extra-signal           | regular semaphore |                    | semaphore-leak   | the signal                |
| parallel-reduction     | reduction         | races, 2 cores     | race             | output index_map          |
| parallel-reduction     | matmul            | races, 2 cores     | race             | output index_map          |
| wait-unsignalled       | regular semaphore |                    | deadlock         | the wait                  |
| shift-prefetch-index   | in-place shift    | races              | race             | x's index_map / the DMA   |
| drop-pipeline-wait     | in-place shift    | races              | dma-not-waited   | the DMA's `.start()`      |
| output-revisited       | outer reduction   |                    | output-revisited | output index_map          |

Where the mutation DELETES a statement (a wait, an init) or changes a non-executable
setting (dimension semantics), no finding can point at it: the anchor is then the
statement where the defect shows — the DMA left unwaited is named by its start, the
never-initialised accumulator by its first read, the doubly written-back output block
by its BlockSpec index_map (the pipeline's write-back has no other source line), and
output elements never written by the kernel function itself.
Secondary findings a defect also causes (e.g. `unwritten-output` from a shifted output
map, `uninitialized` from a dropped wait under `on_wait`) are allowed, not required;
unrelated kinds are not (see `ALLOWED`).

`test_detection_rate` prints a kind x detected/total table (with `-s` or on failure).
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.intercept.session import Session

THIS = Path(__file__).resolve()
_SOURCE = THIS.read_text().splitlines()


def line_of(marker: str) -> int:
    """The line of this file carrying `# MUT:<marker>` (exactly one)."""
    tag = f"# MUT:{marker}"
    hits = [n for n, text in enumerate(_SOURCE, 1) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


# ---------------------------------------------------------------------------------------
# Kernel factories. Defaults build the correct kernel.

CHUNKS = 4  # chunks of the double-buffered DMA loop


def dma_loop(drop_wait: bool = False, next_slot_offset: int = 1) -> Callable[..., Any]:
    """Double-buffered manual DMA over an HBM input: chunk i+1 streams into the other slot
    while chunk i is read. `next_slot_offset=0` starts the next DMA into the slot being read
    (its semaphore is still the next slot's, so the mutant differs in the buffer only)."""

    def kernel(x_hbm, o_ref, buf, sems):
        def copy(chunk, slot, sem_slot=None):
            start = pl.multiple_of(chunk * 8, 8)
            return pltpu.make_async_copy(x_hbm.at[pl.ds(start, 8), :], buf.at[slot],
                                         sems.at[slot if sem_slot is None else sem_slot])

        copy(0, 0).start()  # MUT:dma-start-first

        def body(i, carry):
            slot = i % 2

            @pl.when(i + 1 < CHUNKS)
            def _():
                copy(i + 1, (i + next_slot_offset) % 2, (i + 1) % 2).start()  # MUT:dma-start-next

            if not drop_wait:
                copy(i, slot).wait()  # MUT:dma-wait
            row = pl.multiple_of(i * 8, 8)
            o_ref[pl.ds(row, 8), :] = buf[slot] * 2.0
            return carry

        jax.lax.fori_loop(0, CHUNKS, body, 0)

    def run(x):
        return pl.pallas_call(
            kernel,
            grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((CHUNKS * 8, 128), lambda i: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((CHUNKS * 8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32),
                            pltpu.SemaphoreType.DMA((2,))],
        )(x)

    return run


def dma_loop_args():
    x = jnp.arange(CHUNKS * 8 * 128, dtype=jnp.float32).reshape(CHUNKS * 8, 128)
    return (x,), 2.0 * x


BM = BN = BK = 128


def matmul(init: bool = True, x_shift: int = 0,
           semantics: tuple[str, ...] = ("parallel", "parallel", "arbitrary")
           ) -> Callable[..., Any]:
    """Blocked matmul; the k reduction accumulates in a VMEM scratch zeroed at k == 0."""

    def kernel(x_ref, y_ref, o_ref, acc_ref):
        k = pl.program_id(2)
        if init:
            @pl.when(k == 0)
            def _():
                acc_ref[...] = jnp.zeros_like(acc_ref)  # MUT:mm-init

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)  # MUT:mm-acc

        @pl.when(k == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...]

    def run(x, y):
        m, kk = x.shape
        n = y.shape[1]
        return pl.pallas_call(
            kernel,
            grid=(m // BM, n // BN, kk // BK),
            in_specs=[pl.BlockSpec((BM, BK), lambda i, j, k: (i, k + x_shift)),  # MUT:mm-x-map
                      pl.BlockSpec((BK, BN), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((BM, BN), lambda i, j, k: (i, j)),  # MUT:mm-o-map
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
            scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        )(x, y)

    return run


def matmul_args():
    # Small integers: every sum is exact in f32, whatever the dot's precision.
    x = (jnp.arange(128 * 256) % 7).astype(jnp.float32).reshape(128, 256)
    y = (jnp.arange(256 * 128) % 5).astype(jnp.float32).reshape(256, 128)
    return (x, y), np.asarray(x) @ np.asarray(y)


def elementwise(in_shift: int = 0, out_shift: int = 0) -> Callable[..., Any]:
    """o = 2x + y, one (8, 128) block per grid step."""

    def kernel(x_ref, y_ref, o_ref):  # MUT:ew-kernel
        o_ref[...] = x_ref[...] * 2.0 + y_ref[...]

    def run(x, y):
        return pl.pallas_call(
            kernel,
            grid=(x.shape[0] // 8,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i + in_shift, 0)),  # MUT:ew-x-map
                      pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i + out_shift, 0)),  # MUT:ew-o-map
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x, y)

    return run


def elementwise_args():
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    y = jnp.ones((32, 128), jnp.float32)
    return (x, y), 2.0 * x + y


def semaphores(extra_signals: int = 0, wait_index: int = 0) -> Callable[..., Any]:
    """A REGULAR semaphore signalled once and waited once per grid step."""

    def kernel(x_ref, o_ref, sems):
        o_ref[...] = x_ref[...] + 1.0
        for _ in range(1 + extra_signals):
            pl.semaphore_signal(sems.at[0])  # MUT:sem-signal
        pl.semaphore_wait(sems.at[wait_index])  # MUT:sem-wait

    def run(x):
        return pl.pallas_call(
            kernel,
            grid=(x.shape[0] // 8,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.SemaphoreType.REGULAR((2,))],
        )(x)

    return run


def semaphores_args():
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    return (x,), x + 1.0


def reduction(init: bool = True, semantics: str = "arbitrary") -> Callable[..., Any]:
    """Sum of row blocks into one output block, over an 'arbitrary' grid axis."""

    def kernel(x_ref, o_ref):
        if init:
            @pl.when(pl.program_id(0) == 0)
            def _():
                o_ref[...] = jnp.zeros_like(o_ref)  # MUT:red-init

        o_ref[...] += x_ref[...]  # MUT:red-acc

    def run(x):
        return pl.pallas_call(
            kernel,
            grid=(x.shape[0] // 8,),
            in_specs=[pl.BlockSpec((8, 128), lambda k: (k, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),  # MUT:red-o-map
            out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=(semantics,)),
        )(x)

    return run


def reduction_args():
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    return (x,), np.asarray(x).reshape(4, 8, 128).sum(axis=0)


def in_place_shift(backwards: bool = True, wait: bool = True) -> Callable[..., Any]:
    """Shift by one block, in place: x (read through its BlockSpec) is aliased to the
    output, written by the kernel's own DMA; walking backwards writes only blocks already
    fetched. Forwards, the pipeline prefetches the block the step's DMA writes."""
    blocks = 4

    def kernel(x_ref, o_hbm, sem):
        i = pl.program_id(0)
        j = blocks - 1 - i if backwards else i  # MUT:shift-block
        copy = pltpu.make_async_copy(x_ref, o_hbm.at[pl.ds((j + 1) * 8, 8)], sem)

        @pl.when(j + 1 < blocks)
        def _():
            copy.start()  # MUT:shift-dma
            if wait:
                copy.wait()  # MUT:shift-wait

    def run(x):
        return pl.pallas_call(
            kernel, grid=(blocks,),
            in_specs=[pl.BlockSpec(
                (8, 128), (lambda i: (blocks - 1 - i, 0)) if backwards else (lambda i: (i, 0)))],  # MUT:shift-x-map
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            input_output_aliases={0: 0},
        )(x)

    return run


def in_place_shift_args():
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(32, 128)
    blocks = np.asarray(x).reshape(4, 8, 128)
    return (x,), np.concatenate([blocks[0], *blocks[:-1]])


def outer_reduction(write_pass: int = -1) -> Callable[..., Any]:
    """Reduction axis outer: every output block is visited on each pass; partial sums live
    in per-block scratch and o_ref is written on the last pass only."""
    passes, rows = 3, 2

    def kernel(x_ref, o_ref, acc_ref):
        k, n = pl.program_id(0), pl.program_id(1)

        @pl.when(k == 0)
        def _():
            acc_ref[n] = jnp.zeros(acc_ref.shape[1:], acc_ref.dtype)

        acc_ref[n] += x_ref[...]

        @pl.when(k == write_pass % passes)  # MUT:outer-write-pass
        def _():
            o_ref[...] = acc_ref[n]

    def run(x):
        return pl.pallas_call(
            kernel, grid=(passes, rows),
            in_specs=[pl.BlockSpec((8, 128), lambda k, n: (n, k))],
            out_specs=pl.BlockSpec((8, 128), lambda k, n: (n, 0)),  # MUT:outer-o-map
            out_shape=jax.ShapeDtypeStruct((rows * 8, 128), x.dtype),
            scratch_shapes=[pltpu.VMEM((rows, 8, 128), jnp.float32)],
        )(x)

    return run


def outer_reduction_args():
    x = jnp.arange(16 * 384, dtype=jnp.float32).reshape(16, 384)
    return (x,), np.asarray(x).reshape(16, 3, 128).sum(axis=1)


KERNELS = {
    "in_place_shift": (in_place_shift, in_place_shift_args),
    "outer_reduction": (outer_reduction, outer_reduction_args),
    "dma_loop": (dma_loop, dma_loop_args),
    "matmul": (matmul, matmul_args),
    "elementwise": (elementwise, elementwise_args),
    "semaphores": (semaphores, semaphores_args),
    "reduction": (reduction, reduction_args),
}


# ---------------------------------------------------------------------------------------
# Mutants.


@dataclasses.dataclass(frozen=True)
class Mutant:
    mutation: str  # the kind of defect injected
    kernel: str
    params: dict
    kind: str  # the finding kind it must produce ...
    anchors: tuple[str, ...]  # ... at (one of) these marked lines
    races: bool = False
    cores: int = 1

    @property
    def id(self) -> str:
        params = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.mutation}[{self.kernel}:{params}]->{self.kind}"


MUTANTS = [
    Mutant("drop-dma-wait", "dma_loop", {"drop_wait": True}, "dma-not-waited",
           ("dma-start-first", "dma-start-next")),
    Mutant("dma-into-slot-read", "dma_loop", {"next_slot_offset": 0}, "race",
           ("dma-start-next",), races=True),
    Mutant("shift-index-map", "elementwise", {"in_shift": 1}, "out-of-bounds", ("ew-x-map",)),
    Mutant("shift-index-map", "elementwise", {"out_shift": 1}, "out-of-bounds",
           ("ew-o-map",)),
    Mutant("shift-index-map", "elementwise", {"out_shift": 1}, "unwritten-output",
           ("ew-kernel",)),
    Mutant("shift-index-map", "matmul", {"x_shift": 1}, "out-of-bounds", ("mm-x-map",)),
    Mutant("remove-init", "matmul", {"init": False}, "uninitialized", ("mm-acc",)),
    Mutant("remove-init", "reduction", {"init": False}, "uninitialized", ("red-acc",)),
    Mutant("extra-signal", "semaphores", {"extra_signals": 1}, "semaphore-leak",
           ("sem-signal",)),
    Mutant("parallel-reduction", "reduction", {"semantics": "parallel"}, "race",
           ("red-o-map",), races=True, cores=2),
    Mutant("parallel-reduction", "matmul",
           {"semantics": ("arbitrary", "arbitrary", "parallel")}, "race", ("mm-o-map",),
           races=True, cores=2),
    Mutant("wait-unsignalled", "semaphores", {"wait_index": 1}, "deadlock", ("sem-wait",)),
    # The BlockSpec pipeline: a step's DMA writes the block being prefetched (the race
    # is named at the copy-in's index_map, or at the DMA when the prefetch read first).
    Mutant("shift-prefetch-index", "in_place_shift", {"backwards": False}, "race",
           ("shift-x-map", "shift-dma"), races=True),
    Mutant("output-revisited", "outer_reduction", {"write_pass": 0}, "output-revisited",
           ("outer-o-map",)),
    Mutant("drop-pipeline-wait", "in_place_shift", {"wait": False}, "dma-not-waited",
           ("shift-dma",), races=True),
]

# Secondary kinds a mutation may also cause (consequences of the same defect).
ALLOWED = {
    "drop-dma-wait": {"uninitialized", "race"},
    "dma-into-slot-read": {"uninitialized"},  # the slot it should have filled stays empty
    "shift-index-map": {"out-of-bounds", "uninitialized", "unwritten-output"},
    "remove-init": set(),
    "extra-signal": set(),
    "parallel-reduction": {"uninitialized", "unwritten-output"},
    "wait-unsignalled": set(),
    "shift-prefetch-index": set(),
    # Without the wait the step's DMA into the aliased array overlaps the pipeline's
    # later copies of it.
    "drop-pipeline-wait": {"race", "uninitialized"},
    # The first pass's values are overwritten by later passes' unwritten buffers.
    "output-revisited": {"unwritten-output"},
}

DMA_MODES = [DmaMode.EAGER, DmaMode.ON_WAIT]


def simulate(fn: Callable[..., Any], args: tuple, config: Config):
    session = Session(config)
    with session.install():
        value = jax.block_until_ready(fn(*args))
    assert session.engine_error is None, session.engine_error
    return value, session.findings


# detected[(mutation, kind)] = [hits, total]; filled by test_mutant, read by the summary.
_RESULTS: dict[tuple[str, str], dict[str, bool]] = collections.defaultdict(dict)


def _run_mutant(mutant: Mutant, mode: DmaMode) -> tuple[bool, list]:
    factory, make_args = KERNELS[mutant.kernel]
    args, _ = make_args()
    config = Config(dma_mode=mode, races=mutant.races, cores=mutant.cores)
    _, findings = simulate(factory(**mutant.params), args, config)
    lines = {line_of(a) for a in mutant.anchors}
    hit = any(f.kind.value == mutant.kind and f.frames and f.frames[0].file == str(THIS)
              and f.frames[0].line in lines for f in findings)
    _RESULTS[(mutant.mutation, mutant.kind)][f"{mutant.id}/{mode.value}"] = hit
    return hit, findings


def _describe(findings: list) -> str:
    return "\n".join(f"  {f.kind.value} {f.buffer} line="
                     f"{f.frames[0].line if f.frames else None}: {f.message}"
                     for f in findings) or "  (none)"


@pytest.mark.parametrize("mode", DMA_MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_unmutated_kernel_is_clean(name, mode):
    factory, make_args = KERNELS[name]
    args, expected = make_args()
    for cores in (1, 2):
        out, findings = simulate(factory(), args, Config(dma_mode=mode, races=True,
                                                         cores=cores))
        assert findings == [], f"{name} (cores={cores}):\n{_describe(findings)}"
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)


@pytest.mark.parametrize("mode", DMA_MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_mutant_is_detected_at_its_line(mutant, mode):
    hit, findings = _run_mutant(mutant, mode)
    lines = sorted(line_of(a) for a in mutant.anchors)
    assert hit, (f"{mutant.id} under --dma {mode.value}: expected {mutant.kind} at line(s)"
                 f" {lines}, got:\n{_describe(findings)}")
    stray = {f.kind.value for f in findings} - {mutant.kind} - ALLOWED[mutant.mutation]
    assert not stray, f"{mutant.id}: unrelated finding kinds {stray}:\n{_describe(findings)}"


def test_markers_are_unique_and_on_their_statements():
    for marker in ("ew-kernel", "dma-start-first", "dma-start-next", "dma-wait", "mm-init", "mm-acc",
                   "mm-x-map", "mm-o-map", "ew-x-map", "ew-o-map", "sem-signal", "sem-wait",
                   "red-init", "red-acc", "red-o-map"):
        assert _SOURCE[line_of(marker) - 1].strip().split("#")[0], marker


def test_detection_rate(capsys):
    """Every mutant under both DMA modes (those not run yet in this process are run
    here), then a mutation x detected/total table; the target is 100% for every kind."""
    for mutant in MUTANTS:
        for mode in DMA_MODES:
            if f"{mutant.id}/{mode.value}" not in _RESULTS[(mutant.mutation, mutant.kind)]:
                _run_mutant(mutant, mode)
    rows = []
    for (mutation, kind), runs in sorted(_RESULTS.items()):
        rows.append((mutation, kind, sum(runs.values()), len(runs)))
    width = max(len(r[0]) for r in rows)
    table = [f"{'mutation':<{width}}  {'expected kind':<17} detected/total  rate"]
    table += [f"{m:<{width}}  {k:<17} {d:>8}/{t:<5}  {100 * d / t:5.1f}%"
              for m, k, d, t in rows]
    with capsys.disabled():
        print("\n\nmutation detection rate (both DMA modes)\n" + "\n".join(table))
    missed = [run for runs in _RESULTS.values() for run, hit in runs.items() if not hit]
    assert not missed, "\n".join(table) + f"\nmissed: {missed}"
