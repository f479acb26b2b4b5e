"""The donated operands of a jitted call, copied so that it can be re-run
(pallas_check/intercept/donated.py), and the donated-schedule samples under every DMA
mode (samples/donated_schedule_*: the judge re-runs the donating step on the copies)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_check.intercept import donated
from scenarios.test_samples import SAMPLES, expectations

X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def test_only_the_donated_arrays_are_copied_and_the_copies_are_their_own_buffers():
    x, y = X + 0.0, X * 2.0
    host = np.ones((4,), np.float32)
    kept = donated.keep([x, y, host, 3], [True, False, True, True])
    assert not isinstance(kept, str)
    (copy,) = kept.copies  # y is not donated; numpy and scalars are never consumed
    assert copy.unsafe_buffer_pointer() != x.unsafe_buffer_pointer()
    assert copy.sharding == x.sharding
    np.testing.assert_array_equal(np.asarray(copy), np.asarray(X))
    args = kept.arguments([x, y, host, 3])
    assert args[1] is y and args[2] is host and args[3] == 3
    assert args[0].unsafe_buffer_pointer() not in (x.unsafe_buffer_pointer(),
                                                   copy.unsafe_buffer_pointer())
    kept.release()
    assert copy.is_deleted() and not x.is_deleted()


def test_each_rerun_gets_a_fresh_copy_a_donating_call_may_consume():
    bump = jax.jit(lambda a: a + 1.0, donate_argnums=0)
    x = X + 0.0
    kept = donated.keep([x], [True])
    assert not isinstance(kept, str)
    for _ in range(3):  # the judge may re-run a program several times
        (arg,) = kept.arguments([x])
        np.testing.assert_array_equal(np.asarray(bump(arg)), np.asarray(X) + 1.0)
        assert arg.is_deleted()  # consumed by the donating call (XLA:CPU honours it)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(X))
    kept.release()


def test_operands_past_the_bound_are_not_copied():
    x = X + 0.0  # 4 KiB
    assert not isinstance(donated.keep([x], [True], limit=4096), str)
    assert donated.keep([x, x * 1.0], [True, True], limit=4096) == (
        "its donated operands, 8.0 KiB, are more than the 4.0 KiB pallas-check copies to"
        " re-run a program")


@pytest.mark.parametrize("args", ["--dma on_wait", "--dma eager",
                                  "--dma random --schedules 20"])
def test_the_donated_schedule_samples_under_every_dma_mode(cli, args):
    ok = cli("run", "--races", *args.split(), str(SAMPLES / "donated_schedule_ok.py"))
    assert ok.exit_code == 0 and ok.report["findings"] == [], ok.output
    assert "donated_schedule_ok: output matches" in ok.output
    bug_path = SAMPLES / "donated_schedule_bug.py"
    (want,) = expectations(bug_path)
    bug = cli("run", "--races", *args.split(), str(bug_path))
    assert bug.exit_code == 1, bug.output
    (finding,) = bug.report["findings"]
    assert (finding["kind"], finding["buffer"], finding["index_range"],
            finding["frames"][0]["line"]) == (want["kind"], want["buffer"], [[3, 8]],
                                              int(want["line"]))
    assert want["range"] == "[3:8]"
    assert finding["details"]["reaches"] == [
        {"function": "jax.jit(decode_step)", "result": 0, "range": [[0, 128], [0, 128]],
         "elements": 256}]
