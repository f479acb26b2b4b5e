"""What JAX compiled around a session (intercept/patched_lowering.py `install(programs=)`,
jaxbridge/lowering.py `begin_programs`): a session keys JAX's caches by its settings rather
than emptying them, so that a test's plain programs stay compiled for the next test (issue
55.3: every `jnp` operation of every test was compiled again), while no program holding a
pallas_call is ever run by another session than the one that lowered it, nor outside one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import pallas_check
from pallas_check.findings.finding import FindingKind

from _jax_events import JAXPR_TRACE
from _jax_events import events as compiles


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _unwritten_kernel(x_ref, o_ref):
    o_ref[:4, :] = x_ref[:4, :]  # rows 4..7 of the output are never written


def _call(kernel, interpret: bool = False):
    return jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                                  interpret=interpret))


X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def _plain_steps(x: jax.Array) -> jax.Array:
    return jnp.tanh(x / 1000.0) + 1.0  # jitted per operation: what a test's setup does


def test_a_tests_plain_programs_stay_compiled_for_the_next_test():
    double = _call(_double_kernel)
    seen = []
    for _ in range(2):
        with compiles() as names, pallas_check.checking(project=False, races=False,
                                                        chip_compile=False) as run:
            y = _plain_steps(X)
            out = double(y)
        np.testing.assert_array_equal(np.asarray(out), 2.0 * np.asarray(y))
        assert [c.kernel for c in run.calls] == ["_double_kernel"]
        seen.append(names)
    first, second = seen
    plain = {"jit(true_divide)", "jit(tanh)", "jit(add)"}
    assert plain <= set(first)
    # The next block compiles its kernel's program again (its own interception), and no
    # plain operation.
    assert len(second) == 1 and not plain & set(second), second


def test_each_session_runs_its_own_lowering_of_a_kernel():
    """The same jitted function in two blocks: each block's session checks the call (the
    first block's program, which calls back into the first session, is not run again)."""
    unwritten = _call(_unwritten_kernel)
    for _ in range(2):
        with pallas_check.checking(project=False, races=False, chip_compile=False) as run:
            jax.block_until_ready(unwritten(X))
        assert [c.kernel for c in run.calls] == ["_unwritten_kernel"]
        assert [f.kind for f in run.findings] == [FindingKind.UNWRITTEN_OUTPUT]


def test_outside_a_block_a_kernel_runs_as_jax_lowers_it_and_inside_as_checked():
    """A kernel JAX's HLO interpreter ran before the block (JAX's C++ dispatch holds its
    executable) is intercepted in the block; after it, JAX's own program runs again, and
    the ended session hears of no call."""
    double = _call(_double_kernel, interpret=True)
    want = 2.0 * np.asarray(X)
    np.testing.assert_array_equal(np.asarray(double(X)), want)
    with pallas_check.checking(project=False, races=False, chip_compile=False) as run:
        np.testing.assert_array_equal(np.asarray(double(X)), want)
        np.testing.assert_array_equal(np.asarray(double(X)), want)
    assert [c.kernel for c in run.calls] == ["_double_kernel"] * 2
    np.testing.assert_array_equal(np.asarray(double(X)), want)
    assert len(run.calls) == 2


def test_settings_that_change_a_plain_program_do_not_share_it():
    """A float32 product compiled under the chip's arithmetic is not run under exact
    arithmetic (jaxbridge/chip_arithmetic.py keys JAX's caches by its mode too)."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((8, 128)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((128, 128)), jnp.float32)
    product = jax.jit(lambda a, b: a @ b)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    results = {}
    for chip in (True, False, True):
        with pallas_check.checking(project=False, chip_arithmetic=chip, chip_compile=False):
            results.setdefault(chip, []).append(np.asarray(product(a, b)))
    assert np.abs(results[False][0] - exact).max() < 1e-4
    for rounded in results[True]:
        assert np.abs(rounded - exact).max() > 1e-3


def test_a_blocks_second_call_traces_and_compiles_nothing_under_keyed_caches():
    """What `benchmarks/run.py` times: the second call in a fresh block, blocks with other
    settings between (races off and on, as `--against` alternates them). The keys a
    session puts in JAX's caches (a configuration value) send no call after the first to
    tracing or compiling again, on the compiled tier's path or the program's: the warm-up
    did all of it (a regression of the second call read in session 29 was the benchmark's
    pairing, benchmarks/README.md)."""
    double = _call(_double_kernel)
    for races in (False, True, False, True):
        with pallas_check.checking(project=False, races=races, chip_compile=False,
                                   tier="compiled") as run:
            with compiles() as warm_compiles:
                jax.block_until_ready(double(X))
            with compiles() as compiled, compiles(JAXPR_TRACE) as traced:
                out = double(X)
                jax.block_until_ready(out)
        np.testing.assert_array_equal(np.asarray(out), 2.0 * np.asarray(X))
        assert warm_compiles, "the warm-up compiled nothing: the counting hears no event"
        assert (compiled, traced) == ([], []), races
        assert [c.tier for c in run.calls] == ["compiled", "compiled"], races
