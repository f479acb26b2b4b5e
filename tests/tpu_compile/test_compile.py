"""`--compile` and `pallas-check compile`: pallas_calls compiled for real TPU generations
with libtpu's compile-only devices (no TPU). Compiles take 0.1-2 s each: few and small."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path


from pallas_check.config.exitcodes import ExitCode

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MIB = 1024 * 1024
CHATTER = ("TPU accelerator type", "InitGoogle", "TPU_WORKER_HOSTNAMES", "libtpu",
           "common_lib.cc")


def test_vmem_overflow_on_v5e_and_not_v6e(cli):
    """One block of 16 MiB: over v5e's scoped VMEM (16 MiB), inside v6e's (32 MiB)."""
    path = SAMPLES / "compile_vmem_bug.py"
    result = cli("run", str(path), "--compile", "--tpu", "v5e,v6e")
    assert result.exit_code == ExitCode.FINDINGS, result.output
    assert len(result.findings) == 1, [f["message"] for f in result.findings]
    (finding,) = result.findings
    assert finding["kind"] == "vmem-exceeded" and finding["buffer"] == "o_ref"
    assert finding["details"]["generation"] == "v5e"
    assert finding["details"]["error_code"] == "E1001"
    assert finding["details"]["available_bytes"] == 16 * MIB
    assert finding["details"]["used_bytes"] > 16 * MIB
    assert [a["name"] for a in finding["details"]["allocations"]] == ["o_ref", "x_ref", "y_ref"]
    assert finding["frames"][0]["line"] == 24 and finding["frames"][0]["file"] == str(path)
    assert finding["message"].startswith("v5e: ")
    (call,) = result.report["calls"]
    assert call["compiled"]["v5e"]["status"] == "vmem-exceeded"
    v6e = call["compiled"]["v6e"]
    assert v6e["status"] == "ok" and v6e["vmem_scoped_limit_bytes"] == 32 * MIB
    assert 16 * MIB < v6e["vmem_used_bytes"] < 32 * MIB  # the headroom an author sees
    assert "output matches" in result.output  # the simulation still ran
    table = cli("run", str(path), "--compile", "--tpu", "v5e,v6e", json_report=False)
    assert table.exit_code == ExitCode.FINDINGS
    assert re.search(r"call 0 gram_kernel: v5e vmem-exceeded E1001; v6e \d+\.\d\d MiB of"
                     r" 32\.00 MiB", table.output), table.output


def test_a_fitting_kernel_reports_its_footprint_per_generation(cli):
    runs = [cli("run", str(SAMPLES / "compile_vmem_ok.py"), "--compile", "--tpu", "v5e,v7x")
            for _ in range(2)]
    result = runs[0]
    assert result.exit_code == 0 and result.findings == [], result.output
    (call,) = result.report["calls"]
    assert set(call["compiled"]) == {"v5e", "v7x"}
    for entry in call["compiled"].values():
        assert entry["status"] == "ok" and 0 < entry["vmem_used_bytes"] < 16 * MIB
        assert entry["vmem_scoped_limit_bytes"] in (16 * MIB, 32 * MIB)
        assert "compile_seconds" not in entry  # the report stays deterministic
    assert runs[1].report == runs[0].report


def test_compile_subcommand_table_and_json(tmp_path, cli):
    """Compile only: calls x generations, the failure at the load's line, exit 1."""
    path = SAMPLES / "compile_alignment_bug.py"
    out = tmp_path / "c.json"
    result = cli("compile", str(path), "--tpu", "v5e,v7x", "--format", "json",
                 "--output", str(out))
    assert result.exit_code == ExitCode.FINDINGS, result.output
    report = json.loads(out.read_text())
    assert report["schema"] == "pallas-check/compile-report"
    (call,) = report["calls"]
    assert {g: e["status"] for g, e in call["compiled"].items()} == {
        "v5e": "compile-error", "v7x": "compile-error"}
    assert call["operands"] == [{"shape": [8, 512], "dtype": "float32"}]
    assert sorted((f["kind"], f["details"]["generation"], f["buffer"], f["frames"][0]["line"])
                  for f in report["findings"]) == [
        ("compile-error", "v5e", "x_ref", 21), ("compile-error", "v7x", "x_ref", 21)]
    assert all("E2003" in f["message"] for f in report["findings"])
    table = cli("compile", str(path), "--tpu", "v5e")
    assert table.exit_code == ExitCode.FINDINGS
    assert "compile-error E2003" in table.output
    assert "compile_alignment_bug.py:21: compile-error" in table.output
    clean = cli("compile", str(SAMPLES / "compile_alignment_ok.py"), "--tpu", "v6e")
    assert clean.exit_code == ExitCode.CLEAN, clean.output
    assert "ok" in clean.output and "1 pallas_call compiled for 1 generation: 0 failures" in (
        clean.output)


def test_bad_tpu_and_missing_libtpu_are_one_line_exit_2(cli, monkeypatch):
    bad = cli("run", str(SAMPLES / "add_ok.py"), "--tpu", "v5e,v9")
    assert bad.exit_code == ExitCode.USAGE and "v9" in bad.output
    from pallas_check.tpu_compile import toolchain

    real = toolchain.importlib.util.find_spec
    monkeypatch.setattr(toolchain.importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else real(name, *a))
    for argv in (["run", str(SAMPLES / "add_ok.py"), "--compile"],
                 ["compile", str(SAMPLES / "add_ok.py")]):
        result = cli(*argv)
        assert result.exit_code == ExitCode.USAGE
        (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
        assert line.startswith("pallas-check: error: --compile needs libtpu")
        assert 'pip install "pallas-check[tpu]"' in line


PER_DEVICE = """\
import jax, jax.numpy as jnp, numpy as np
from functools import partial
from jax.experimental import pallas as pl
from jax.sharding import Mesh, PartitionSpec as P

def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

def scale(x):
    return pl.pallas_call(scale_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

x = jnp.ones((32, 128), jnp.float32)
mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
sharded = jax.jit(jax.shard_map(scale, mesh=mesh, in_specs=P("d"), out_specs=P("d"),
                                  check_vma=False))(x)
batched = jax.vmap(scale)(jnp.ones((3, 16, 128), jnp.float32))
print(float(sharded.sum()), float(batched.sum()))
"""


def test_shard_map_and_vmap_calls_compile_at_their_own_shapes(tmp_path):
    """In a fresh process (two CPU devices), which also shows libtpu's start-up chatter
    never reaches stderr."""
    script = tmp_path / "per_device.py"
    script.write_text(PER_DEVICE)
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pallas_check", "compile", str(script), "--devices", "2",
         "--tpu", "v6e", "--format", "json", "--output", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(word in proc.stderr for word in CHATTER), proc.stderr
    calls = json.loads(out.read_text())["calls"]
    assert [c["devices"] for c in calls] == [2, 1]
    assert [c["operands"][0]["shape"] for c in calls] == [[16, 128], [3, 16, 128]]
    assert all(c["compiled"]["v6e"]["status"] == "ok" for c in calls)


def test_plain_run_keeps_libtpu_quiet(tmp_path):
    """libtpu installed: JAX tries it when its backends start, in every run."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_PLATFORMS"}
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "run",
                           str(SAMPLES / "add_ok.py")], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(word in proc.stderr for word in CHATTER), proc.stderr


def test_pytest_plugin_honours_compile(pytester):
    shutil = __import__("shutil")
    shutil.copy(SAMPLES / "compile_block_shape_bug.py", pytester.path / "blocky.py")
    pytester.makepyfile(test_blocky=textwrap.dedent("""\
        import jax.numpy as jnp
        import blocky

        def test_scale():
            blocky.scale(jnp.ones((32, 128), jnp.float32))
        """))
    result = pytester.runpytest_subprocess(
                                           "--pallas-check", "--pallas-check-compile")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "TPU compile errors" in text and "block shape" in text
    plain = pytester.runpytest_subprocess(
                                          "--pallas-check")
    plain.assert_outcomes(passed=1)


def test_hook_honours_compile(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pallas-check]\nscripts = ["blocky.py"]\ncompile = true\ntpu = "v5e"\n')
    (tmp_path / "blocky.py").write_text((SAMPLES / "compile_block_shape_bug.py").read_text())
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "hook"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == ExitCode.FINDINGS, proc.stdout + proc.stderr
    assert "TPU compile errors" in proc.stdout and "blocky.py: exit 1" in proc.stdout


pytest_plugins = ["pytester"]


def test_calls_under_grad_compile_and_repeats_compile_once(monkeypatch):
    """A kernel with a custom_vjp whose backward pass is another kernel: both calls of
    jax.grad compiled; the same call made again is not compiled again (per generation)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from pallas_check.config import Config
    from pallas_check.intercept.session import Session
    from pallas_check.tpu_compile import compiler
    from pallas_check.tpu_compile.stage import compile_session

    def scaled(x, name):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 3.0

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              name=name)(x)

    @jax.custom_vjp
    def triple(x):
        return scaled(x, "forward")

    triple.defvjp(lambda x: (scaled(x, "forward"), None),
                  lambda _, g: (scaled(g, "backward"),))
    compiled: list[str] = []
    real = compiler._compile
    monkeypatch.setattr(compiler, "_compile", lambda params, *rest: (
        compiled.append(params["name"]) or real(params, *rest)))
    monkeypatch.setattr(compiler, "_cache", {})
    session = Session(Config(compile=True, tpu="v5e,v6e"))
    x = jnp.ones((8, 128), jnp.float32)
    grad = jax.jit(jax.grad(lambda x: triple(x).sum()))
    with session.install():
        first = jax.block_until_ready(grad(x))
        second = jax.block_until_ready(grad(x + 1.0))  # the same calls again
    compile_session(session)
    assert float(first.sum()) == float(second.sum()) == 3.0 * 8 * 128
    assert len(session.calls) == 4 and session.findings == []
    # Each kernel once per generation, though each was called twice.
    assert sorted(compiled) == ["backward", "backward", "forward", "forward"]
    for summary in session.calls:
        assert {g: e["status"] for g, e in summary.compiled.items()} == {"v5e": "ok",
                                                                         "v6e": "ok"}
