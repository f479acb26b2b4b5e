"""Memory a kernel never touches (issue #29, section 3): a per-call note, not a finding.

The kernel's scratch (`scratch_shapes`, `pl.run_scoped`) and output blocks, or parts of
them, that no read or write of the whole call touched, with their bytes and ranges, in the
JSON report (`calls[].unused_memory`) and one line per call in the table; the exit code and
the findings are those of a run without it (engine/memory/usage.py has the semantics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config

_HALF = {"buffer": "acc_ref", "memory_space": "VMEM", "bytes": 4096, "of_bytes": 8192,
         "ranges": [[[8, 16], [0, 128]]]}


def test_sample_notes_the_unused_half_of_its_scratch_in_json(cli, sample):
    result = cli("run", sample("unused_scratch_ok.py"))
    assert result.exit_code == 0  # a note changes no exit code
    assert result.findings == []
    assert "output matches" in result.output
    [call] = result.report["calls"]
    assert call["unused_memory"] == [_HALF]


def test_sample_notes_the_unused_half_in_one_table_line(cli, sample, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for the whole line (80 folds it)
    result = cli("run", sample("unused_scratch_ok.py"), json_report=False)
    assert result.exit_code == 0
    lines = [line.strip() for line in result.output.splitlines()]
    assert "Memory never touched (a note, not a finding):" in lines
    assert ("call 0 block_sum_kernel: acc_ref [8:16, 0:128] never touched:"
            " 4.00 KiB of 8.00 KiB VMEM") in lines
    assert lines[-1] == "pallas-check: 0 findings in 1 pallas_call"


def test_no_note_when_all_scratch_is_used(cli, sample):
    result = cli("run", sample("uninit_acc_ok.py"), json_report=False)
    assert result.exit_code == 0
    assert "never touched" not in result.output
    report = cli("run", sample("uninit_acc_ok.py")).report
    assert [c["unused_memory"] for c in report["calls"]] == [[]]


def test_a_bug_keeps_its_finding_beside_the_note(check):
    """A kernel that reads its accumulator before zeroing it (uninitialized) and uses half
    of it: the finding is there as without the note, and so is the note."""
    def kernel(x_ref, o_ref, acc_ref):
        acc_ref[0:8, :] += x_ref[...]
        o_ref[...] = acc_ref[0:8, :]

    def call(x):
        return pl.pallas_call(
            kernel, grid=(1,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32)])(x)

    checked = check(call, jnp.ones((8, 128), jnp.float32))
    assert checked.kinds() == ["uninitialized"]
    [summary] = checked.session.calls
    assert [u.to_dict() for u in summary.unused_memory] == [_HALF]


def _dma_kernel(rows: int):
    """x stays in HBM; the kernel DMAs `rows` rows of it into a (16, 128) scratch and
    copies rows 0:8 of the scratch to its output."""
    def kernel(x_hbm, o_ref, acc_ref, sem):
        copy = pltpu.make_async_copy(x_hbm.at[0:rows], acc_ref.at[0:rows], sem)
        copy.start()
        copy.wait()
        o_ref[...] = acc_ref[0:8, :]

    def call(x):
        return pl.pallas_call(
            kernel, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA])(x)

    return call


def test_a_dma_landing_in_scratch_is_a_use(check):
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    half = check(_dma_kernel(8), x)
    np.testing.assert_array_equal(half.value, x[:8])
    assert half.findings == []
    [summary] = half.session.calls
    assert [u.to_dict() for u in summary.unused_memory] == [_HALF]
    whole = check(_dma_kernel(16), x)  # rows 8:16 land by DMA, never read: still used
    np.testing.assert_array_equal(whole.value, x[:8])
    [summary] = whole.session.calls
    assert summary.unused_memory == []


def test_scoped_memory_used_in_parts_over_steps_is_one_union(check):
    """Each grid step enters a run_scoped (16, 128) buffer and uses 4 rows of it (step i:
    rows 4i:4i+4); the scope's end makes it undefined again, but what any step touched
    counts: rows 8:16 only are never touched."""
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)

        def body(tmp_ref):
            rows = pl.ds(pl.multiple_of(i * 4, 4), 4)
            tmp_ref[rows, :] = x_ref[...] * 2.0
            o_ref[...] = tmp_ref[rows, :]

        pl.run_scoped(body, pltpu.VMEM((16, 128), jnp.float32))

    def call(x):
        return pl.pallas_call(
            kernel, grid=(2,),
            in_specs=[pl.BlockSpec((4, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((4, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)

    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    checked = check(call, x)
    np.testing.assert_array_equal(checked.value, 2.0 * x)
    assert checked.findings == []
    [summary] = checked.session.calls
    [note] = summary.unused_memory
    assert (note.memory_space, note.bytes, note.of_bytes, note.ranges) == (
        "VMEM", 4096, 8192, (((8, 16), (0, 128)),))


def test_every_core_counts_and_schedules_agree(check):
    """Two cores, each its own copy of the scratch, over several schedules: a row is
    untouched only if no core touched it (core c uses rows 4c:4c+4 of 16)."""
    def kernel(x_ref, o_ref, acc_ref):
        c = pl.program_id(0)
        rows = pl.ds(pl.multiple_of(c * 4, 4), 4)
        acc_ref[rows, :] = x_ref[...] + 1.0
        o_ref[...] = acc_ref[rows, :]

    def call(x):
        return pl.pallas_call(
            kernel, grid=(2,),
            in_specs=[pl.BlockSpec((4, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((4, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))(x)

    x = jnp.zeros((8, 128), jnp.float32)
    checked = check(call, x, config=Config(cores=2, schedules=3, keep_going=True))
    np.testing.assert_array_equal(checked.value, np.ones((8, 128)))
    [summary] = checked.session.calls
    assert [(u.bytes, u.ranges) for u in summary.unused_memory] == [
        (4096, (((8, 16), (0, 128)),))]


def test_ranges_are_said_when_simple_and_bytes_always():
    from pallas_check.engine.memory.usage import boxes
    from pallas_check.findings.finding import UnusedMemory

    mask = np.zeros((16, 128), bool)
    mask[8:16] = True
    assert boxes(mask) == [((8, 16), (0, 128))]
    mask[0:2, 64:128] = True  # two boxes: rows 0:2 right half, rows 8:16 whole
    assert boxes(mask) == [((0, 2), (64, 128)), ((8, 16), (0, 128))]
    checkerboard = (np.indices((8, 8)).sum(axis=0) % 2).astype(bool)
    assert boxes(checkerboard) is None  # not simple: bytes only
    note = UnusedMemory("acc_ref", "VMEM", 128, 256, ())
    assert note.text() == "acc_ref (in parts) never touched: 128 B of 256 B VMEM"
    two = UnusedMemory("acc_ref", "VMEM", 5120, 8192, (((0, 2), (64, 128)), ((8, 16), (0, 128))))
    assert two.text() == ("acc_ref [0:2, 64:128], [8:16, 0:128] never touched:"
                          " 5.00 KiB of 8.00 KiB VMEM")
