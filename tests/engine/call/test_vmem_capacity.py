"""Simulated VMEM and SMEM are bounded as a TPU's are (engine/call/capacity.py): a call that no
chip of `--tpu` could run (over the scoped VMEM limit, the chip's VMEM or its SMEM) is a
`vmem-exceeded` finding at the pallas_call line, is not simulated (nothing of it is
allocated), and the run goes on. Capacities and limits: JAX's tpu_info.py and libtpu
(16 MiB default scoped VMEM on v5e, 32 MiB on v6e, 1 MiB SMEM)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pallas_check.config.exitcodes import ExitCode

MIB = 1024 * 1024
ROW = 512  # bytes of one (1, 128) f32 row

# Each argument is one call: ROWS:LIMIT:SPACE (LIMIT 0: no vmem_limit_bytes).
_SCRIPT = textwrap.dedent('''\
    import resource
    import sys

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu


    def vmem_kernel(x_ref, o_ref, s_ref):
        s_ref[0:8, :] = x_ref[...] + 1
        o_ref[...] = s_ref[0:8, :]


    def smem_kernel(x_ref, o_ref, s_ref):
        s_ref[0] = 3
        o_ref[...] = x_ref[...] + s_ref[0].astype(jnp.float32)


    def call(x, rows, limit, space):
        kernel, scratch = ((smem_kernel, pltpu.SMEM((rows,), jnp.int32)) if space == "smem"
                           else (vmem_kernel, pltpu.VMEM((rows, 128), jnp.float32)))
        params = pltpu.CompilerParams(vmem_limit_bytes=limit) if limit else None
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[scratch], compiler_params=params)(x)


    if __name__ == "__main__":
        x = jnp.ones((8, 128), jnp.float32)
        for spec in sys.argv[1:]:
            rows, limit, space = spec.split(":")
            y = np.asarray(call(x, int(rows), int(limit), space))
            print(spec, "nan" if np.isnan(y).all() else float(y[0, 0]))
        # This process's own peak: VmHWM (ru_maxrss keeps the forking pytest worker's
        # peak across exec, Linux's signal->maxrss)
        try:
            with open("/proc/self/status") as status:
                peak = status.read().split("VmHWM:")[1].split()[0]
        except (OSError, IndexError):
            peak = str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        print("maxrss_kib", peak)
''')
CALL_LINE = next(i for i, line in enumerate(_SCRIPT.splitlines(), 1)
                 if "pl.pallas_call(" in line)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "capacity.py"
    path.write_text(_SCRIPT)
    return path


def _spec(nbytes: int, limit: int = 0, space: str = "vmem") -> str:
    rows = nbytes // (4 if space == "smem" else ROW)
    return f"{rows}:{limit}:{space}"


def _printed(output: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in output.splitlines()
                if line.count(":") == 2 and " " in line)


def _capped_run(script: Path, report: Path, options: list[str],
                specs: list[str]) -> subprocess.CompletedProcess:
    """`pallas-check run` in a child under `ulimit -v 8000000` (set by the child itself
    before JAX starts: no preexec_fn in this process, which runs JAX's threads)."""
    capped = ("import resource, runpy, sys; cap = 8000000 * 1024;"
              " resource.setrlimit(resource.RLIMIT_AS, (cap, cap));"
              " sys.argv = ['pallas-check', *sys.argv[1:]];"
              " runpy.run_module('pallas_check', run_name='__main__')")
    return subprocess.run(
        [sys.executable, "-c", capped, "run", "--format", "json", "-o", str(report),
         *options, str(script), "--", *specs], capture_output=True, text=True, timeout=600)


def test_64_gib_and_1_gib_scratch_under_an_address_space_cap(script, tmp_path):
    """Before: 64 GiB of scratch was a MemoryError (exit 4), 1 GiB was allocated and
    reported clean. Now both are vmem-exceeded at the pallas_call line, neither is
    allocated (peak RSS stays far below 1 GiB), and the call after them is checked."""
    report = tmp_path / "report.json"
    specs = [_spec(64 * 1024 * MIB), _spec(1024 * MIB), _spec(8 * ROW)]
    proc = _capped_run(script, report, [], specs)
    output = proc.stdout + proc.stderr
    assert proc.returncode == ExitCode.FINDINGS, output
    assert "MemoryError" not in output
    data = json.loads(report.read_text())
    assert len(data["calls"]) == 3 and not any(c["failed"] for c in data["calls"])
    findings = data["findings"]
    assert [(f["kind"], f["call_index"], f["buffer"], f["memory_space"],
             f["frames"][0]["line"]) for f in findings] == [
        ("vmem-exceeded", 0, "s_ref", "VMEM", CALL_LINE),
        ("vmem-exceeded", 1, "s_ref", "VMEM", CALL_LINE)]
    huge, big = findings
    assert huge["details"]["used_bytes"] == 64 * 1024 * MIB + 2 * 4096
    assert huge["details"]["available_bytes"] == 128 * MIB  # v5e's VMEM
    assert huge["details"]["simulated"] is False
    assert huge["message"].startswith("v5e: 64.00 GiB of VMEM needed, 128.00 MiB available"
                                      " (over the chip's VMEM); largest allocations:"
                                      " scratch s_ref 64.00 GiB")
    assert huge["message"].endswith("not simulated: its outputs hold the --uninit fill (NaN)")
    assert big["details"]["available_bytes"] == 128 * MIB
    printed = _printed(proc.stdout)
    assert printed[specs[0]] == printed[specs[1]] == "nan"  # the fill, as the finding says
    assert printed[specs[2]] == "2.0"  # the run went on: the next call simulated
    maxrss = int(proc.stdout.split("maxrss_kib ")[1].split()[0]) * 1024
    assert maxrss < 1024 * MIB, maxrss


def test_scoped_vmem_limit_and_vmem_limit_bytes(cli, script):
    """v5e's default scoped VMEM is 16 MiB: a kernel needing exactly that is clean, one
    tile more is vmem-exceeded (libtpu: E1001); vmem_limit_bytes=32 MiB lets 20 MiB in,
    and 20 MiB over a raised limit of 18 MiB is still refused."""
    blocks = 2 * 4096  # x_ref and o_ref, one (8, 128) f32 tile each
    specs = [_spec(16 * MIB - blocks), _spec(16 * MIB - blocks + 8 * ROW),
             _spec(20 * MIB, 32 * MIB), _spec(20 * MIB, 18 * MIB), _spec(8 * ROW)]
    result = cli("run", str(script), "--", *specs)
    assert result.exit_code == ExitCode.FINDINGS, result.output
    got = [(f["kind"], f["call_index"], f["details"]["used_bytes"],
            f["details"]["available_bytes"], f["frames"][0]["line"]) for f in result.findings]
    assert got == [("vmem-exceeded", 1, 16 * MIB + 8 * ROW, 16 * MIB, CALL_LINE),
                   ("vmem-exceeded", 3, 20 * MIB + blocks, 18 * MIB, CALL_LINE)]
    assert "over the default scoped VMEM limit; raise it with pltpu.CompilerParams(" \
        "vmem_limit_bytes=...)" in result.findings[0]["message"]
    assert "over the call's vmem_limit_bytes" in result.findings[1]["message"]
    printed = _printed(result.output)
    assert [printed[s] for s in specs] == ["2.0", "nan", "2.0", "nan", "2.0"]


def test_a_call_that_fits_one_generation_is_simulated(cli, script):
    """20 MiB: over v5e's 16 MiB scoped VMEM, inside v6e's 32 MiB. Alone on v5e it is not
    simulated; with `--tpu v5e,v6e` it is (it fits v6e) and v5e's overflow reported; on
    v6e alone it is clean."""
    spec = _spec(20 * MIB)
    both = cli("run", "--tpu", "v5e,v6e", str(script), "--", spec)
    assert both.exit_code == ExitCode.FINDINGS, both.output
    (finding,) = both.findings
    assert finding["details"]["generation"] == "v5e" and finding["details"]["simulated"]
    assert finding["message"].endswith("simulated (it fits v6e)")
    assert _printed(both.output)[spec] == "2.0"
    v6e = cli("run", "--tpu", "v6e", str(script), "--", spec)
    assert v6e.exit_code == 0 and v6e.findings == [], v6e.output


def test_smem_is_bounded_by_the_chips(cli, script):
    """SMEM is 1 MiB on every generation: 2 MiB of SMEM scratch is refused (libtpu: "Ran
    out of memory in memory space smem"), 64 KiB is clean, and the run goes on."""
    specs = [_spec(2 * MIB, space="smem"), _spec(64 * 1024, space="smem"), _spec(8 * ROW)]
    result = cli("run", str(script), "--", *specs)
    assert result.exit_code == ExitCode.FINDINGS, result.output
    (finding,) = result.findings
    assert (finding["kind"], finding["call_index"], finding["memory_space"],
            finding["buffer"], finding["frames"][0]["line"]) == (
        "vmem-exceeded", 0, "SMEM", "s_ref", CALL_LINE)
    assert finding["details"]["used_bytes"] == 2 * MIB
    assert finding["details"]["available_bytes"] == MIB
    assert finding["message"].startswith("v5e: 2.00 MiB of SMEM needed, 1.00 MiB available"
                                         " (over the chip's SMEM)")
    printed = _printed(result.output)
    assert [printed[s] for s in specs] == ["nan", "4.0", "2.0"]


def test_with_compile_the_compilers_verdict_replaces_the_reckoning(script, tmp_path):
    """`--compile` on 64 GiB of scratch: before, the simulation's MemoryError (exit 4)
    came first and the compiler's vmem-exceeded was never reached. Now the call is not
    simulated, and the compiler's finding (libtpu: over the chip's VMEM) is the one
    reported, saying the call was not simulated; the next call compiles and runs."""
    report = tmp_path / "report.json"
    specs = [_spec(64 * 1024 * MIB), _spec(8 * ROW)]
    proc = _capped_run(script, report, ["--compile", "--tpu", "v5e"], specs)
    output = proc.stdout + proc.stderr
    assert proc.returncode == ExitCode.FINDINGS, output
    assert "MemoryError" not in output
    data = json.loads(report.read_text())
    (finding,) = data["findings"]
    assert (finding["kind"], finding["call_index"], finding["buffer"],
            finding["frames"][0]["line"]) == ("vmem-exceeded", 0, "s_ref", CALL_LINE)
    assert "reckoned" not in finding["details"]  # the compiler's own numbers
    assert finding["details"]["available_bytes"] == 128 * MIB
    assert finding["details"]["simulated"] is False
    assert finding["message"].endswith("not simulated: its outputs hold the --uninit fill"
                                       " (NaN)")
    assert [c["findings"] for c in data["calls"]] == [1, 0]
    assert [c["compiled"]["v5e"]["status"] for c in data["calls"]] == ["vmem-exceeded", "ok"]
    assert _printed(proc.stdout)[specs[1]] == "2.0"


_BLOCKS = textwrap.dedent('''\
    import sys

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    ROWS = 10240  # a (10240, 128) f32 block: 5 MiB


    def copy_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1


    def copy(x, steps):
        spec = pl.BlockSpec((ROWS, 128), lambda i: (i, 0))
        return pl.pallas_call(copy_kernel, grid=(steps,), in_specs=[spec], out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


    def scoped_kernel(x_ref, o_ref):
        def body(big_ref):
            big_ref[0:8, :] = x_ref[...] + 1
            o_ref[...] = big_ref[0:8, :]

        pl.run_scoped(body, pltpu.VMEM((40960, 128), jnp.float32))  # 20 MiB


    def scoped(x):
        return pl.pallas_call(scoped_kernel,
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)


    def aliased_kernel(x_ref, o_ref, s_ref):
        s_ref[0:8, :] = x_ref[...]
        o_ref[...] = s_ref[0:8, :] + 1


    def aliased(x):
        return pl.pallas_call(
            aliased_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((65536, 128), jnp.float32)],  # 32 MiB
            input_output_aliases={0: 0})(x)


    if __name__ == "__main__":
        one = np.asarray(copy(jnp.ones((ROWS, 128), jnp.float32), 1))
        two = np.asarray(copy(jnp.ones((2 * ROWS, 128), jnp.float32), 2))
        small = jnp.full((8, 128), 5.0, jnp.float32)
        print("one", float(one[0, 0]), "two", "nan" if np.isnan(two).all() else two[0, 0])
        print("scoped", "nan" if np.isnan(np.asarray(scoped(small))).all() else "ran")
        print("aliased", float(np.asarray(aliased(small))[0, 0]))
''')


def test_blocks_double_buffered_run_scoped_and_aliased_outputs(cli, tmp_path):
    """Two 5 MiB blocks fit v5e's 16 MiB in one grid step and not double-buffered over
    two; a 20 MiB pl.run_scoped allocation is reckoned too; an over-capacity call whose
    output is aliased to its input returns that input."""
    path = tmp_path / "blocks.py"
    path.write_text(_BLOCKS)
    lines = _BLOCKS.splitlines()
    call_lines = [i for i, line in enumerate(lines, 1) if "pl.pallas_call(" in line]
    result = cli("run", str(path))
    assert result.exit_code == ExitCode.FINDINGS, result.output
    got = [(f["call_index"], f["buffer"], f["details"]["used_bytes"],
            f["frames"][0]["line"]) for f in result.findings]
    assert got == [(1, "x_ref", 20 * MIB, call_lines[0]),
                   (2, "big_ref", 20 * MIB + 4096 * 2, call_lines[1]),
                   (3, "s_ref", 32 * MIB + 4096 * 2, call_lines[2])], result.findings
    allocations = result.findings[0]["details"]["allocations"]
    assert [(a["name"], a["what"], a["nbytes"]) for a in allocations] == [
        ("x_ref", "block (double-buffered)", 10 * MIB),
        ("o_ref", "block (double-buffered)", 10 * MIB)]
    assert "aliased outputs keep their inputs" in result.findings[2]["message"]
    assert "one 2.0 two nan" in result.output
    assert "scoped nan" in result.output and "aliased 5.0" in result.output


# -- what the compiler allocates: one buffer for a block fetched once, headroom at the limit

def _matmul_params(rows: int, w_map, grid: int = 2, k: int = 2048, n: int = 1024) -> dict:
    """The pallas_call params of x (grid*rows, k) @ w (k, n) in row blocks, w's block
    under `w_map` (no simulation: the reckoning reads the params only)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    def call(x, w):
        return pl.pallas_call(
            kernel, grid=(grid,),
            in_specs=[pl.BlockSpec((rows, k), lambda i: (i, 0)), pl.BlockSpec((k, n), w_map)],
            out_specs=pl.BlockSpec((rows, n), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((grid * rows, n), jnp.float32))(x, w)

    x = jax.ShapeDtypeStruct((grid * rows, k), jnp.float32)
    w = jax.ShapeDtypeStruct((2 * k, n), jnp.float32)
    (eqn,) = jax.make_jaxpr(call)(x, w).eqns
    return eqn.params


@pytest.mark.parametrize("w_map,copies", [
    (lambda i: (0, 0), 1), (lambda i: (1, 0), 1), (lambda i: (i * 0, 0), 1),
    (lambda i: (i - i, 0), 1), (lambda i: (i % 2, 0), 2), (lambda i: (i, 0), 2)])
def test_a_block_with_a_constant_index_map_is_counted_once(w_map, copies):
    """libtpu 0.0.42 (v6e) allocates one buffer for a block whose index map is constant
    over the grid (4 MiB more scoped VMEM for a 4 MiB block under (0, 0), (1, 0),
    (i * 0, 0) or (i - i, 0); 8 MiB under (i % 2, 0)): reckoned the same, to the byte."""
    from pallas_check.engine.call import footprint

    got = {(a.name, a.what, a.nbytes) for a in
           footprint.allocations(_matmul_params(512, w_map, k=1024))}
    assert got == {("x_ref", "block (double-buffered)", 2 * 2 * MIB),
                   ("w_ref", "block" if copies == 1 else "block (double-buffered)",
                    copies * 4 * MIB),
                   ("o_ref", "block (double-buffered)", 2 * 2 * MIB)}


def test_a_matmul_at_the_limit_is_reported_and_still_simulated():
    """Blocks of exactly v6e's 32 MiB around a 4 MiB matmul result: the compiler's own
    scratch does not fit (libtpu 0.0.42: E1001); reckoned at the limit, with 0.8 MiB of
    headroom named, and the call still simulated. 26 MiB of blocks leave room (it
    compiles at 26.6 MiB): nothing. v7x (it compiled the 32 MiB kernel) is not judged."""
    from pallas_check.config import TpuGeneration
    from pallas_check.engine.call import capacity

    at_limit = _matmul_params(1024, lambda i: (0, 0))
    (over,) = capacity.overflows(at_limit, TpuGeneration.V6E)
    assert (over.at_limit, over.needed, over.available, over.space) == (
        True, 32 * MIB, 32 * MIB, "VMEM")
    assert "about 819.2 KiB for a matmul result" in over.reason, over.reason
    assert capacity.overflows(at_limit, TpuGeneration.V7X) == []
    assert capacity.overflows(_matmul_params(768, lambda i: (0, 0)), TpuGeneration.V6E) == []


_UNUSED_SCRATCH = textwrap.dedent('''\
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu


    def kernel(x_ref, o_ref, unused_ref):
        o_ref[...] = x_ref[...] + 1


    x = jnp.ones((8, 128), jnp.float32)
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         scratch_shapes=[pltpu.VMEM((81920, 128), jnp.float32)])(x)
    print("out", float(np.asarray(out)[0, 0]))
''')


def test_with_compile_a_successful_compile_withdraws_the_reckoning(cli, tmp_path):
    """40 MiB of scratch the kernel never reads: reckoned over v6e's 32 MiB (and not
    simulated), but Mosaic drops it and the call compiles: with --compile no finding is
    left (the README: the compiler's verdict replaces the reckoning)."""
    path = tmp_path / "unused.py"
    path.write_text(_UNUSED_SCRATCH)
    plain = cli("run", "--tpu", "v6e", str(path))
    assert [(f["kind"], f["buffer"], f["details"]["used_bytes"]) for f in plain.findings] == [
        ("vmem-exceeded", "unused_ref", 40 * MIB + 2 * 4096)], plain.output
    compiled = cli("run", "--tpu", "v6e", "--compile", str(path))
    assert compiled.exit_code == ExitCode.CLEAN, compiled.output
    assert compiled.findings == []
    (call,) = compiled.report["calls"]
    assert call["compiled"]["v6e"]["status"] == "ok" and call["findings"] == 0
