"""`--update-baseline` by several runs at once (issue 36, item 7): each keeps every other
run's entries. Two scripts updating one baseline in parallel (CI jobs, a pre-commit hook
beside a developer's run) had one's fingerprints lost: each wrote the entries it had read
at its start. Now the update re-reads the file under an exclusive lock (report/suppress.py
`update_baseline`) and merges."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

from pallas_check.findings.finding import Finding, FindingKind, KernelInfo, SourceFrame
from pallas_check.report.suppress import make_policy

SAMPLES = Path(__file__).resolve().parents[2] / "samples"

# A script that checks a buggy kernel (an out-of-bounds read) and, while it runs, another
# run's update lands in the baseline: this script's own run read the baseline before that.
_MEANWHILE = '''
import json, pathlib
pathlib.Path({baseline!r}).write_text(json.dumps({{
    "schema": "pallas-check/baseline", "schema_version": 1,
    "findings": [{{"fingerprint": "other-run", "kind": "race", "kernel": "k", "buffer": "b",
                  "file": "other.py", "code": "", "script": "other.py"}}]}}))
'''


def test_an_update_keeps_what_another_run_wrote_meanwhile(cli, tmp_path):
    baseline = tmp_path / "baseline.json"
    baseline.write_text('{"schema": "pallas-check/baseline", "findings": []}\n')
    script = tmp_path / "oob.py"
    script.write_text((SAMPLES / "oob_load_bug.py").read_text()
                      + _MEANWHILE.format(baseline=str(baseline)))
    result = cli("run", "--baseline", str(baseline), "--update-baseline", str(script))
    assert result.exit_code == 0, result.output
    entries = json.loads(baseline.read_text())["findings"]
    assert sorted((e["script"], e["kind"]) for e in entries) == [
        ("oob.py", "out-of-bounds"), ("other.py", "race")]


def _finding(file: str) -> Finding:
    return Finding(FindingKind.OUT_OF_BOUNDS, "m", KernelInfo("k", file, 1), 0,
                   frames=(SourceFrame(file, 2, "k", "x = x_ref[...]"),))


def test_the_update_waits_for_the_lock_and_merges_under_it(tmp_path):
    """While another writer holds the baseline's lock, an update waits; once it is
    released the update reads what that writer wrote, and keeps it."""
    from pallas_check.report.suppress import update_baseline

    baseline = tmp_path / "baseline.json"
    policy = make_policy(None, baseline, True, True)  # no file yet: read nothing
    mine = str(tmp_path / "mine.py")
    update = threading.Thread(target=update_baseline,
                              args=(policy, [_finding(mine)], mine, _write))
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)  # another writer's lock
        update.start()
        update.join(timeout=1.0)
        assert update.is_alive(), "the update did not wait for the lock"
        _write(baseline, json.dumps({"schema": "pallas-check/baseline", "findings": [
            {"fingerprint": "theirs", "script": "theirs.py", "kind": "race"}]}))
    finally:
        os.close(folder)  # releases the lock
    update.join(timeout=60)
    assert not update.is_alive()
    entries = json.loads(baseline.read_text())["findings"]
    assert sorted(e["script"] for e in entries) == ["mine.py", "theirs.py"]


def _write(path: Path, text: str) -> None:
    path.write_text(text)
