"""Each generation of `--tpu` compiled as it traces (pallas_check/intercept/generations.py): a
wrapper whose shapes follow the chip (a SparseCore kernel's lanes) is run again as each
further generation in a process of its own, its calls compiled for that chip; with
--tpu-all that run's calls are checked too. tests/scripts/per_chip.py holds the kernels;
`pallas-check compile`'s own runs per generation: tests/scenarios/test_sparsecore_samples.py."""

from __future__ import annotations

from pathlib import Path

from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
PER_CHIP = ROOT / "tests" / "scripts" / "per_chip.py"
KIB = 1024


def test_each_generation_is_compiled_and_checked_as_it_traces(cli):
    """`lanes` traced as v6e is 8 lanes wide, which v7x's SparseCore refuses ("Get only
    supports int32 arrays of shapes [(16,)], got (8,)"): v7x's own run traces it 16 wide
    (its scratch twice v6e's) and it compiles for both. `spill` writes lanes-wide chunks
    into an output sized for 8 lanes: right as v6e traces it, out of bounds as v7x does;
    only v7x's run meets it: with --tpu-all it is found, said to be v7x's; without, the v6e
    run alone is checked and clean."""
    result = cli("run", str(PER_CHIP), "--tpu", "v6e,v7x", "--tpu-all", "--compile", "--",
                 "lanes", "spill")
    assert result.exit_code == ExitCode.FINDINGS, result.output
    lanes, spill = result.report["calls"]
    assert {g: (e["status"], e["vmem_scratch_bytes"], e["vmem_capacity_bytes"])
            for g, e in lanes["compiled"].items()} == {"v6e": ("ok", 8 * 4, 256 * KIB),
                                                       "v7x": ("ok", 16 * 4, 512 * KIB)}
    assert {g: e["status"] for g, e in spill["compiled"].items()} == {"v6e": "ok",
                                                                     "v7x": "ok"}
    [finding] = result.findings
    assert (finding["kind"], finding["buffer"], finding["frames"][0]["line"],
            finding["call_index"]) == ("out-of-bounds", "o_hbm", 37, 1)
    assert finding["message"].startswith("traced as v7x: DMA destination of o_hbm[32:48]")
    assert finding["details"]["traced_as"] == "v7x"
    assert result.report["traces"] == {"v7x": {"own_process": True, "calls": 2,
                                               "findings": 1, "script_error": None}}
    alone = cli("run", str(PER_CHIP), "--tpu", "v6e,v7x", "--", "lanes", "spill")
    assert alone.exit_code == ExitCode.CLEAN and alone.findings == [], alone.output
    assert alone.report["traces"] == {}
