"""pre-commit: `.pre-commit-hooks.yaml`, `pallas-check hook`, and a real round trip.

The round trip makes a temporary git repository with a buggy kernel script, a pyproject
naming it and a `.pre-commit-config.yaml`, runs `pre-commit run --all-files` (pre-commit
from PyPI), and checks that it fails, then passes once the kernel is fixed. The hook there
is a `repo: local` one (`language: system`, entry `python -m pallas_check hook`): a
`language: python` hook would pip-install this repository and JAX into a fresh virtualenv,
which needs the network. `.pre-commit-hooks.yaml` itself is checked with pre-commit's own
manifest loader.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"


def _have_pre_commit() -> bool:
    if importlib.util.find_spec("pre_commit") is None:
        # The test extra lists pre-commit; try once to install it from PyPI.
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "pre-commit"],
                       capture_output=True, timeout=180, check=False)
        importlib.invalidate_caches()
    return importlib.util.find_spec("pre_commit") is not None


@pytest.fixture(scope="module")
def pre_commit() -> None:
    if not _have_pre_commit():
        pytest.skip("pre-commit is not installed and could not be installed from PyPI")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PALLAS_CHECK_") or k == "PALLAS_CHECK_CACHE_DIR"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.update(extra)
    return env


def hook(cwd: Path, *files: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pallas_check", "hook", *files], cwd=cwd,
                          env=clean_env(), capture_output=True, text=True, timeout=300)


def test_hooks_manifest(pre_commit):
    from pre_commit.clientlib import load_manifest

    hooks = load_manifest(str(ROOT / ".pre-commit-hooks.yaml"))  # pre-commit's own schema
    (entry,) = [h for h in hooks if h["id"] == "pallas-check"]
    for key in ("id", "name", "entry", "language"):
        assert entry[key], key
    assert entry["language"] == "python"
    assert entry["entry"].split()[:2] == ["pallas-check", "hook"]
    assert entry["pass_filenames"] is True and entry["types"] == ["python"]
    assert entry["require_serial"] is True
    # The entry's console command exists in this installation.
    assert shutil.which("pallas-check") or importlib.util.find_spec("pallas_check")


def test_hook_config_errors_exit_2(tmp_path):
    proc = hook(tmp_path)
    assert proc.returncode == ExitCode.USAGE
    assert "[tool.pallas-check]" in proc.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.pallas-check]\nscripts = ["nope.py"]\n')
    proc = hook(tmp_path)
    assert proc.returncode == ExitCode.USAGE and "nope.py" in proc.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.pallas-check]\npattern = "k/*.py"\n')
    proc = hook(tmp_path)
    assert proc.returncode == ExitCode.USAGE and "matches no file" in proc.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.pallas-check]\nscript = ["a.py"]\n')
    proc = hook(tmp_path)
    assert proc.returncode == ExitCode.USAGE and "'script'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_hook_exit_code_is_the_worst(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(SAMPLES / "dma_not_waited_bug.py", kernels / "a_check.py")
    shutil.copy(SAMPLES / "dma_not_waited_ok.py", kernels / "b_check.py")
    (kernels / "c_check.py").write_text("raise SystemExit('broken script')\n")
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.pallas-check]
        scripts = ["kernels/b_check.py"]
        pattern = "kernels/[ab]_check.py"
        dma = "on_wait"
    """))
    sub = tmp_path / "kernels"  # run from a subfolder: scripts are relative to pyproject
    proc = hook(sub, "kernels/a_check.py")
    assert proc.returncode == ExitCode.FINDINGS, proc.stdout + proc.stderr
    assert "kernels/a_check.py: exit 1 (findings)" in proc.stdout
    assert "kernels/b_check.py: exit 0 (clean)" in proc.stdout
    assert proc.stdout.count("kernels/b_check.py: exit") == 1  # listed twice, run once
    assert "DMAs never waited" in proc.stdout
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pallas-check]\npattern = "kernels/*_check.py"\n')
    proc = hook(tmp_path)
    assert proc.returncode == ExitCode.USER_ERROR, proc.stdout + proc.stderr
    assert "kernels/c_check.py: exit 3" in proc.stdout


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                   env=clean_env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
                                 GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com"))


def test_pre_commit_round_trip(pre_commit, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "kernel-repo"
    (repo / "kernels").mkdir(parents=True)
    shutil.copy(SAMPLES / "dma_not_waited_bug.py", repo / "kernels" / "copy_check.py")
    (repo / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "my-kernels"
        version = "0.0.1"

        [tool.pallas-check]
        scripts = ["kernels/copy_check.py"]
        dma = "on_wait"
    """))
    entry = f"{shlex.quote(sys.executable)} -m pallas_check hook"
    (repo / ".pre-commit-config.yaml").write_text(textwrap.dedent(f"""\
        repos:
          - repo: local
            hooks:
              - id: pallas-check
                name: pallas-check
                entry: {entry}
                language: system
                pass_filenames: true
                types: [python]
                require_serial: true
    """))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    env = clean_env(PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))

    def pre_commit_run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files",
                               "--color", "never"], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=300)

    failed = pre_commit_run()
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0, output
    assert "pallas-check" in output and "Failed" in output, output
    assert "DMAs never waited" in output and "copy_check.py:21" in output, output

    shutil.copy(SAMPLES / "dma_not_waited_ok.py", repo / "kernels" / "copy_check.py")
    _git(repo, "add", "-A")
    passed = pre_commit_run()
    output = passed.stdout + passed.stderr
    assert passed.returncode == 0, output
    assert "Passed" in output, output
