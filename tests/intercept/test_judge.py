"""Undecided output elements judged by what the program keeps (pallas_check/intercept/judge.py,
intercept/outer.py) and arrays made by `jnp.empty` as never-written memory (intercept/empties.py).

A call's `unwritten-output` / `uninitialized` findings wait for the jitted call around it;
that call is run again with the undecided elements holding other values, and a finding
stands only where the program's results change, naming the results it reaches. Where the
program cannot be re-run, the finding stands as the kernel's boundary decides it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.engine.call import explore
from pallas_check.intercept import donated
from pallas_check.findings.finding import FindingKind

X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) / 64.0


def _top_half_kernel(x_ref, o_ref):  # rows 4..8 of the output are never written
    o_ref[0:4, :] = x_ref[0:4, :] * 2.0


def _top_half(x):
    return pl.pallas_call(_top_half_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype))(x)


def _full_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def _full(x):
    return pl.pallas_call(_full_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype))(x)


def _counting(monkeypatch) -> list[bool]:
    """Each engine run of a call: True for a checked one, False for a re-run's."""
    runs: list[bool] = []
    original = explore.run_call_devices

    def counted(*args, **kwargs):
        runs.append(kwargs.get("live") is not None)
        return original(*args, **kwargs)

    monkeypatch.setattr(explore, "run_call_devices", counted)
    return runs


def test_padding_the_jitted_caller_slices_off_is_not_reported(check, monkeypatch):
    runs = _counting(monkeypatch)
    head = jax.jit(lambda x: _top_half(x)[:4])

    def three_times(x):  # every run goes through the hook (JAX's fast path refused)
        return [head(x + i) for i in range(3)]

    checked = check(three_times, X)
    assert checked.findings == []
    for i, value in enumerate(checked.value):
        np.testing.assert_array_equal(np.asarray(value), (np.asarray(X)[:4] + i) * 2.0)
    assert [c.findings for c in checked.session.calls] == [0, 0, 0]
    assert runs == [True, False] * 3  # each call checked once, its program re-run once


def test_rows_the_caller_keeps_are_reported_with_the_results_they_reach(check):
    checked = check(jax.jit(lambda x: (x.sum(), _top_half(x)[:6])), X)
    (finding,) = checked.findings
    assert (finding.kind, finding.buffer, finding.index_range) == (
        FindingKind.UNWRITTEN_OUTPUT, "o_ref", ((4, 8), (0, 128)))
    assert finding.details["reaches"] == [
        {"function": "jax.jit(<lambda>)", "result": 1, "range": [[4, 6], [0, 128]],
         "elements": 256}]
    assert finding.message.endswith(
        "(kept by the program: result 1 of jax.jit(<lambda>)[4:6, 0:128], 256 elements)")
    assert [c.findings for c in checked.session.calls] == [1]


def test_an_output_the_program_returns_as_it_is_needs_no_rerun(check, monkeypatch):
    runs = _counting(monkeypatch)
    checked = check(jax.jit(lambda x: (x.sum(), _top_half(x), _full(x))), X)
    assert [(f.kind, f.details["reaches"]) for f in checked.findings] == [
        (FindingKind.UNWRITTEN_OUTPUT,
         [{"function": "jax.jit(<lambda>)", "result": 1, "range": [[4, 8], [0, 128]],
           "elements": 512}])]
    assert runs == [True, True]  # the two calls checked, the program not re-run


def test_where_keeping_the_fully_written_output_is_not_reported(check):
    @jax.jit
    def step(flag, x):
        return jnp.where(flag, _full(x), _top_half(x))

    checked = check(step, True, X)
    assert checked.findings == []
    np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(X) + 1.0)
    flipped = check(step, False, X)
    assert [(f.kind, f.details["reaches"][0]["range"]) for f in flipped.findings] == [
        (FindingKind.UNWRITTEN_OUTPUT, [[4, 8], [0, 128]])]


def test_a_finding_already_kept_is_counted_again_without_a_rerun(check, monkeypatch):
    runs = _counting(monkeypatch)
    keep_six = jax.jit(lambda x: _top_half(x)[:6] + 0.0)

    checked = check(lambda x: [keep_six(x + i) for i in range(3)], X)
    (finding,) = checked.findings
    assert (finding.kind, finding.count, finding.details["reaches"][0]["range"]) == (
        FindingKind.UNWRITTEN_OUTPUT, 3, [[4, 6], [0, 128]])
    # The first run judged by a re-run; the next two only add to the count.
    assert runs == [True, False, True, True]


def test_a_finding_dropped_once_is_judged_again_on_the_next_run(check, monkeypatch):
    runs = _counting(monkeypatch)

    @jax.jit
    def step(flag, x):
        return jnp.where(flag, _full(x), _top_half(x))

    checked = check(lambda x: [step(True, x), step(False, x)], X)
    (finding,) = checked.findings  # the second run keeps the rows the first dropped
    assert (finding.kind, finding.count, finding.details["reaches"][0]["range"]) == (
        FindingKind.UNWRITTEN_OUTPUT, 1, [[4, 8], [0, 128]])
    assert runs == [True, True, False, False] * 2  # each run judged by a re-run of both


def test_of_two_calls_only_the_one_whose_rows_reach_a_result_is_reported(check):
    # Both calls leave rows 4..8 unwritten; the program keeps them of the second only.
    checked = check(jax.jit(lambda x: (_top_half(x)[:4], _top_half(x * 3.0))), X)
    (finding,) = checked.findings
    second = max(c.index for c in checked.session.calls)
    assert finding.call_index == second
    assert finding.details["reaches"] == [
        {"function": "jax.jit(<lambda>)", "result": 1, "range": [[4, 8], [0, 128]],
         "elements": 512}]
    assert sorted(c.findings for c in checked.session.calls) == [0, 1]


def _table_kernel(x_ref, o_ref):  # a metadata table: only its head is written
    o_ref[0:2, :] = x_ref[0:2, :] + 1.0


def _reader(row):
    def kernel(t_ref, o_ref):
        o_ref[...] = jnp.broadcast_to(t_ref[row:row + 1, :] * 2.0, o_ref.shape)

    return lambda t: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128),
                                                                           t.dtype))(t)


@pytest.mark.parametrize("row, reported", [(1, False), (6, True)])
def test_a_table_tail_the_next_kernel_never_reads_is_not_reported(check, row, reported):
    def table(x):
        return pl.pallas_call(_table_kernel,
                              out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype))(x)

    checked = check(jax.jit(lambda x: _reader(row)(table(x))), X)
    assert [(f.kind, f.kernel.name, f.index_range) for f in checked.findings] == (
        [(FindingKind.UNWRITTEN_OUTPUT, "_table_kernel", ((2, 8), (0, 128)))]
        if reported else [])
    if not reported:
        np.testing.assert_array_equal(
            np.asarray(checked.value),
            np.broadcast_to((np.asarray(X)[1:2] + 1.0) * 2.0, (8, 128)))


def test_the_iterations_of_a_scan_are_told_apart(check):
    def body(carry, _):
        return carry + _top_half(carry)[:4].sum(), None

    checked = check(jax.jit(lambda x: jax.lax.scan(body, x, None, length=3)[0]), X)
    assert checked.findings == []


def _scratch_kernel(x_ref, o_ref, scratch_ref):
    o_ref[0:4, :] = x_ref[0:4, :]
    o_ref[4:8, :] = scratch_ref[4:8, :]  # never-written scratch reaches rows 4..8


def _scratch(x):
    return pl.pallas_call(_scratch_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
                          scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])(x)


@pytest.mark.parametrize("rows, reported", [(4, False), (6, True)])
def test_never_written_memory_that_reaches_dropped_rows_only_is_not_reported(
        check, rows, reported):
    checked = check(jax.jit(lambda x: _scratch(x)[:rows]), X)
    assert [(f.kind, f.buffer, f.details.get("reaches")) for f in checked.findings] == (
        [(FindingKind.UNINITIALIZED, "scratch_ref",
          [{"function": "jax.jit(<lambda>)", "result": 0, "range": [[4, 6], [0, 128]],
            "elements": 256}])] if reported else [])


def test_an_eager_call_is_its_own_program(check, monkeypatch):
    runs = _counting(monkeypatch)
    checked = check(lambda x: _top_half(x)[:4], X)  # the slice is an eager op of its own
    (finding,) = checked.findings
    assert finding.details["reaches"] == [
        {"function": "the eager pallas_call", "result": 0, "range": [[4, 8], [0, 128]],
         "elements": 512}]
    assert runs == [True]  # its outputs are its results: no re-run needed


def _keeping(monkeypatch) -> list[tuple]:
    """The copies each program took of its donated operands (intercept/donated.py)."""
    taken: list[tuple] = []
    original = donated.keep

    def keep(*args, **kwargs):
        kept = original(*args, **kwargs)
        if not isinstance(kept, str):
            taken.append(kept.copies)
        return kept

    monkeypatch.setattr(donated, "keep", keep)
    return taken


@pytest.mark.parametrize("rows, reported", [(4, False), (6, True)])
def test_a_donating_call_is_rerun_on_copies_of_what_it_donates(check, monkeypatch, rows,
                                                                reported):
    """XLA:CPU honours the donation (the updated cache takes the donated cache's buffer):
    the script's cache is consumed as JAX consumes it without pallas-check, its results
    are right, and the padding rows are judged by a re-run, as without donation."""
    runs, taken = _counting(monkeypatch), _keeping(monkeypatch)
    step = jax.jit(lambda cache, x: (cache + 1.0, _top_half(x)[:rows]), donate_argnums=0)
    cache = jnp.full((8, 128), 5.0, jnp.float32)
    checked = check(step, cache, X)
    assert cache.is_deleted()  # donated: the first run consumed the script's buffer
    np.testing.assert_array_equal(np.asarray(checked.value[0]), np.full((8, 128), 6.0))
    head = np.asarray(checked.value[1])
    np.testing.assert_array_equal(head[:4], np.asarray(X)[:4] * 2.0)
    assert np.isnan(head[4:]).all()  # the rows kept past the written ones: the NaN fill
    assert runs == [True, False]  # checked, then re-run on the copy
    assert [f.details.get("reaches") for f in checked.findings] == (
        [[{"function": "jax.jit(<lambda>)", "result": 1, "range": [[4, 6], [0, 128]],
           "elements": 256}]] if reported else [])
    ((copy,),) = taken
    assert copy.is_deleted()  # released once the program was judged


def test_a_donation_xla_cannot_use_leaves_the_scripts_array_as_it_was(check, monkeypatch):
    """Where no output can take the donated buffer XLA:CPU warns and keeps it: the
    script's array stays whole and unchanged, and the re-run ran on a copy."""
    taken = _keeping(monkeypatch)
    donating = jax.jit(lambda x: _top_half(x)[:4], donate_argnums=0)
    x = X + 0.0
    with pytest.warns(UserWarning, match="donated"):
        checked = check(donating, x)
    assert checked.findings == []
    assert not x.is_deleted()
    np.testing.assert_array_equal(np.asarray(x), np.asarray(X))
    np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(X)[:4] * 2.0)
    assert len(taken) == 1


def test_donated_operands_past_the_bound_are_judged_at_the_kernel_boundary(check,
                                                                          monkeypatch):
    monkeypatch.setattr(donated, "KEPT_BYTES", 1024)  # X is 4 KiB
    runs = _counting(monkeypatch)
    step = jax.jit(lambda cache, x: (cache + 1.0, _top_half(x)[:4]), donate_argnums=0)
    checked = check(step, X + 0.0, X)
    (finding,) = checked.findings
    assert (finding.kind, finding.buffer, finding.index_range) == (
        FindingKind.UNWRITTEN_OUTPUT, "o_ref", ((4, 8), (0, 128)))
    assert finding.details["judged_at"] == "kernel boundary"
    assert finding.message.endswith(
        "(judged at the kernel's boundary: jax.jit(<lambda>) donates its arguments,"
        " so it cannot be re-run (its donated operands, 4.0 KiB, are more than the"
        " 1.0 KiB pallas-check copies to re-run a program))")
    assert runs == [True]  # no re-run


def test_a_donating_call_returning_its_kernels_outputs_copies_nothing(check, monkeypatch):
    """Every output of its kernel is a result as it is: what the kernel left undecided is
    judged without a re-run, so nothing is copied."""
    runs, taken = _counting(monkeypatch), _keeping(monkeypatch)
    checked = check(jax.jit(_top_half, donate_argnums=0), X + 0.0)
    (finding,) = checked.findings
    assert finding.details["reaches"] == [
        {"function": "jax.jit(_top_half)", "result": 0, "range": [[4, 8], [0, 128]],
         "elements": 512}]
    assert (runs, taken) == ([True], [])


def test_a_call_with_side_effects_is_judged_at_the_kernel_boundary(check):
    seen = []

    def keep(v):
        seen.append(np.array(v))
        return v

    shape = jax.ShapeDtypeStruct((4, 128), jnp.float32)
    checked = check(jax.jit(lambda x: io_callback(keep, shape, _top_half(x)[:4])), X)
    (finding,) = checked.findings
    assert "(judged at the kernel's boundary: jax.jit(<lambda>) has side effects" in (
        finding.message)
    assert len(seen) == 1  # the script's callback ran once: nothing re-ran it


def test_a_failed_rerun_keeps_the_finding_at_the_boundary(check, monkeypatch):
    original = explore.run_call_devices

    def rerun_fails(*args, **kwargs):
        if kwargs.get("live") is None:
            raise RuntimeError("broken re-run")
        return original(*args, **kwargs)

    monkeypatch.setattr(explore, "run_call_devices", rerun_fails)
    checked = check(jax.jit(lambda x: _top_half(x)[:4]), X)
    np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(X)[:4] * 2.0)
    (finding,) = checked.findings
    assert finding.message.endswith(
        "(judged at the kernel's boundary: re-running jax.jit(<lambda>) failed"
        " (RuntimeError: broken re-run))")
    assert checked.session.engine_error is None


def _accumulate_kernel(x_ref, acc_ref, o_ref):
    o_ref[...] = acc_ref[...] + x_ref[...]


@jax.jit
def _accumulate(x, acc):
    return pl.pallas_call(_accumulate_kernel, out_shape=jax.ShapeDtypeStruct(acc.shape,
                                                                            acc.dtype),
                          input_output_aliases={1: 0})(x, acc)


@pytest.mark.parametrize("make, reported", [
    (lambda: jnp.empty((8, 128), jnp.float32), True),
    (lambda: jnp.empty_like(X), True),
    (lambda: jax.lax.empty((8, 128), jnp.float32), True),
    (lambda: jnp.zeros((8, 128), jnp.float32), False),
])
def test_an_input_made_by_jnp_empty_is_never_written(check, make, reported):
    def run(x):
        acc = make()  # made while the session is installed, eagerly
        return _accumulate(x, acc)

    checked = check(run, X)
    assert [(f.kind, f.buffer, f.index_range) for f in checked.findings] == (
        [(FindingKind.UNINITIALIZED, "acc_ref", ((0, 8), (0, 128)))] if reported else [])
    if not reported:
        np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(X))


def test_jnp_empty_inside_jit_is_a_broadcast_of_zeros_and_not_tracked(check):
    checked = check(jax.jit(lambda x: _accumulate(x, jnp.empty((8, 128), jnp.float32))), X)
    assert checked.findings == []
    np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(X))


def test_an_empty_array_computed_on_is_not_tracked(check):
    def run(x):
        acc = jnp.empty((8, 128), jnp.float32).at[0].set(1.0)  # a new array
        return _accumulate(x, acc)

    assert check(run, X).findings == []


def test_a_loop_leaving_the_same_rows_holds_them_once(check, monkeypatch):
    from pallas_check.intercept import judge

    def body(carry, _):
        return carry + _top_half(carry)[:4].sum(), None

    program = jax.jit(lambda x: jax.lax.scan(body, x, None, length=3)[0])
    one = 8 * 128 + 4  # one run's mask (a bool per element) and its value (one f32)
    monkeypatch.setattr(judge, "HELD_BYTES", one)
    assert check(program, X).findings == []  # three runs, one mask held
    monkeypatch.setattr(judge, "HELD_BYTES", 0)
    (finding, *_) = check(program, X).findings
    assert finding.details["why"] == (
        "jax.jit(<lambda>) left more undecided elements than pallas-check holds to re-run it")
