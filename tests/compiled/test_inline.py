"""Calls lowered inline: the compiled tier's computation traced into the script's own
program (intercept/patched_lowering.py `Inline`), its verdict read by one small host call.

What must hold: a clean call's outputs are the engine's, bit for bit, and it is listed as
one call of the compiled tier, every time it runs (a loop's iterations too); a call whose
run does not stand (a verdict bit, an input made by `jnp.empty`) is the handler's, with the
engine's findings; and the kernel keeps the engine's arithmetic (a NaN a mask multiplies
stays NaN) while a program with no call inline compiles as it would without pallas-check.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from compiled.test_tier import checked, dma_call, findings
from pallas_check.config import Config, Tier
from pallas_check.intercept import tiers
from pallas_check.intercept.inline import InlineCalls
from pallas_check.intercept.session import Session


def _counting_inline_runs(monkeypatch) -> list[int]:
    """What each inline call's host decision answered (0: its run stood)."""
    answers: list[int] = []
    original = InlineCalls._decide

    def counted(self, *args, **kwargs):
        answer = original(self, *args, **kwargs)
        answers.append(answer)
        return answer

    monkeypatch.setattr(InlineCalls, "_decide", counted)
    return answers


def _built_at_once(monkeypatch) -> None:
    """Under `auto`, a structure built at its first call, which waits for its build."""
    monkeypatch.setattr(tiers, "compile_seconds", lambda call: 0.0)
    monkeypatch.setattr(tiers.Tiers, "wait_for_builds", True)


def _inlined_at_once(monkeypatch) -> None:
    """Inline from a structure's first call (not once its callbacks paid a compile)."""
    monkeypatch.setattr(tiers, "inline_seconds", lambda call: 0.0)


def _no_host_path(monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("the compiled tier ran through the host callback")

    monkeypatch.setattr(tiers.Tiers, "run", refused)


def test_a_clean_call_runs_inline_once_per_run_with_the_engines_outputs(monkeypatch):
    x = jax.random.normal(jax.random.key(0), (16, 8, 128), jnp.float32)
    call = dma_call(16, 3)

    @jax.jit
    def program(x):
        looped = jax.lax.fori_loop(0, 3, lambda i, acc: acc + call(x), jnp.zeros((8, 128)))
        return looped + call(x)

    want, engine = checked(program, x, tier=Tier.ENGINE)
    _inlined_at_once(monkeypatch)
    answers = _counting_inline_runs(monkeypatch)
    _no_host_path(monkeypatch)
    got, inline = checked(program, x, tier=Tier.COMPILED, races=True)
    assert answers == [0, 0, 0, 0]
    assert [c.tier for c in inline.calls] == ["compiled"] * 4
    assert sorted(c.index for c in inline.calls) == [0, 1, 2, 3]
    assert all(c.races["accesses_checked"] > 0 for c in inline.calls)
    assert inline.findings == engine.findings == []
    np.testing.assert_array_equal(got, want)
    one = np.asarray(x).sum(0) + np.asarray(x)[3]
    np.testing.assert_allclose(got, 4 * one, rtol=1e-5)


def test_a_call_whose_verdict_is_set_goes_to_the_engine_finding_for_finding(monkeypatch):
    """The last DMA's source box leaves the array: the inline run's out-of-bounds bit
    sends the call down the branch that runs the handler, which reports it."""
    x = jnp.ones((4, 8, 128), jnp.float32)
    program = jax.jit(lambda x: dma_call(4, 4)(x) * 2)
    _, engine = checked(program, x, tier=Tier.ENGINE)
    _inlined_at_once(monkeypatch)
    answers = _counting_inline_runs(monkeypatch)
    _, compiled = checked(program, x, tier=Tier.COMPILED)
    assert answers == [1]
    assert [(c.tier, c.tier_reason) for c in compiled.calls] == [
        ("engine", "the compiled run saw out-of-bounds")]
    assert findings(compiled) == findings(engine)
    assert [k for k, *_ in findings(engine)] == ["out-of-bounds"]


def _copy_in(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def test_an_input_made_empty_goes_to_the_engine(monkeypatch):
    """`jnp.empty` memory is never written on a TPU: only the call's operands show it, so
    the host decision sends the call to the engine, which finds the read."""
    call = pl.pallas_call(_copy_in, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    program = jax.jit(lambda x: call(x))
    _built_at_once(monkeypatch)
    _inlined_at_once(monkeypatch)
    answers = _counting_inline_runs(monkeypatch)
    session = Session(Config(tier=Tier.AUTO))
    with session.install():
        jax.block_until_ready(program(jnp.ones((8, 128), jnp.float32)))
        jax.block_until_ready(program(jnp.empty((8, 128), jnp.float32)))
    assert answers == [0, 1]
    assert [c.tier for c in session.calls] == ["compiled", "engine"]
    kinds = {(f.kind.value, f.buffer, f.call_index) for f in session.findings}
    assert kinds == {("uninitialized", "x_ref", 1)}, kinds


def _masked(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * (y_ref[...] > 0).astype(jnp.float32)


def test_a_nan_a_mask_multiplies_stays_nan_inline_as_on_the_engine(monkeypatch):
    """XLA's algebraic simplifier turns `x * convert(mask)` into a select that drops the
    NaN (Mosaic multiplies: a TPU keeps it); a program with a call inline is compiled
    without it, as the engine's own programs are."""
    call = pl.pallas_call(_masked, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    x = jnp.full((8, 128), jnp.nan, jnp.float32).at[0, 0].set(2.0)
    y = jnp.full((8, 128), -1.0, jnp.float32).at[0, 0].set(1.0)
    program = jax.jit(lambda x, y: call(x, y))
    want, _ = checked(program, x, y, tier=Tier.ENGINE)
    _inlined_at_once(monkeypatch)
    answers = _counting_inline_runs(monkeypatch)
    got, inline = checked(program, x, y, tier=Tier.COMPILED)
    assert answers == [0] and [c.tier for c in inline.calls] == ["compiled"]
    assert np.isnan(want[1:]).all() and want[0, 0] == 2.0
    np.testing.assert_array_equal(got, want)


def test_a_program_with_no_call_inline_compiles_as_without_pallas_check():
    """Under `--tier engine` the script's own `x * mask` next to the kernel is compiled
    with XLA's simplifier, as plain JAX compiles it (its NaN dropped)."""
    call = pl.pallas_call(_copy_in, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    x = jnp.full((8, 128), jnp.nan, jnp.float32)
    mask = jnp.zeros((8, 128), bool)

    def program(x, mask):
        return call(x), x * mask.astype(jnp.float32)

    session = Session(Config(tier=Tier.ENGINE))
    with session.install():
        _, masked = jax.block_until_ready(jax.jit(program)(x, mask))
    plain = jax.jit(lambda x, mask: x * mask.astype(jnp.float32))(x, mask)
    np.testing.assert_array_equal(np.asarray(masked), np.asarray(plain))
    assert np.asarray(masked).max() == 0.0  # the simplifier's select: the NaN dropped


def test_a_structure_is_inlined_once_its_callbacks_have_paid_a_compile(monkeypatch):
    """A structure's calls go through the host callback until they have cost
    about what compiling it into the program costs; the program is then compiled again,
    with the call inline, and its later runs are decided on the host by the verdict."""
    x = jax.random.normal(jax.random.key(4), (16, 8, 128), jnp.float32)
    program = jax.jit(lambda x: dma_call(16, 3)(x) + 1.0)
    _built_at_once(monkeypatch)
    monkeypatch.setattr(tiers, "inline_seconds", lambda call: 2.5 * tiers._HOST_CALL_SECONDS)
    answers = _counting_inline_runs(monkeypatch)
    session = Session(Config(tier=Tier.AUTO))
    with session.install():
        outputs = [np.asarray(jax.block_until_ready(program(x))) for _ in range(6)]
    assert [c.tier for c in session.calls] == ["compiled"] * 6
    assert answers == [0, 0, 0]  # calls 1-3 through the callback, 4-6 inline
    for got in outputs[1:]:
        np.testing.assert_array_equal(got, outputs[0])
    np.testing.assert_allclose(outputs[0], np.asarray(x).sum(0) + np.asarray(x)[3] + 1.0,
                               rtol=1e-5)


def _first_rows(n_ref, x_ref, o_ref):
    """Writes the first n rows of the output (n from SMEM), leaves the rest unwritten."""
    for row in range(8):
        @pl.when(row < n_ref[0])
        def _(row=row):
            o_ref[row] = x_ref[row] * 2.0


def test_a_rerun_keys_a_sites_calls_as_the_first_run_did(monkeypatch):
    """One site, twice in a loop: the first call writes every row and runs inline; the
    second leaves rows unwritten and goes to the engine, whose finding waits for the
    program. The program keeps those rows (it sums the outputs), so its re-run, with the
    rows holding other values, changes its result and the finding stands: the re-run
    counts the inline call as the first run did, and the exposures reach the second."""
    call = pl.pallas_call(
        _first_rows, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pltpu.VMEM)])
    x = jax.random.normal(jax.random.key(5), (8, 128), jnp.float32)
    counts = jnp.array([[8], [5]], jnp.int32)

    @jax.jit
    def program(x, counts):
        return jax.lax.fori_loop(0, 2, lambda i, acc: acc + call(counts[i], x),
                                 jnp.zeros((8, 128), jnp.float32))

    _inlined_at_once(monkeypatch)
    answers = _counting_inline_runs(monkeypatch)
    session = Session(Config(tier=Tier.COMPILED))
    with session.install():
        jax.block_until_ready(program(x, counts))
    assert answers[:2] == [0, 1]
    assert [c.tier for c in sorted(session.calls, key=lambda c: c.index)] == [
        "compiled", "engine"]
    found = [(f.kind.value, f.call_index) for f in session.findings]
    assert found == [("unwritten-output", 1)], found
