"""The CLI worker (tests/_cli_worker.py) that many tests run `pallas-check` through: a run
that hangs or kills its process fails that test with a clear message, and the next
request gets a fresh worker."""

from __future__ import annotations

import pytest

from _cli_worker import CliWorkerError, device_count, run_cli


def test_device_count_is_the_argvs():
    assert device_count(["run", "k.py"]) == 1
    assert device_count(["run", "--devices", "4", "k.py"]) == 4
    assert device_count(["run", "--devices=2", "k.py"]) == 2
    assert device_count(["run", "k.py", "--", "--devices", "3"]) == 1


def test_a_hung_or_dying_run_fails_alone_and_the_worker_comes_back(tmp_path):
    hang, die = tmp_path / "hang.py", tmp_path / "die.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    die.write_text("import os\nos._exit(7)\n")  # the process ends mid-run
    first = run_cli(["run", "missing.py"], cwd=tmp_path, timeout=120)  # the worker is up
    assert first.returncode == 2 and "script not found: missing.py" in first.stderr
    with pytest.raises(CliWorkerError, match="no answer in 3 s"):
        run_cli(["run", str(hang)], cwd=tmp_path, timeout=3)
    with pytest.raises(CliWorkerError, match=r"died \(exit \d+\) during the run"):
        run_cli(["run", str(die)], cwd=tmp_path, timeout=120)
    again = run_cli(["run", "missing.py"], cwd=tmp_path, timeout=120)
    assert again.returncode == 2 and "script not found: missing.py" in again.stderr
