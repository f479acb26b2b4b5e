"""The catalogue of finding kinds (pallas_check/findings/kinds.py) is complete, and one identity.

Every kind has its entry (the table's title, the SARIF rule's name, description and help,
a level) and a buggy sample under samples/ that states it (`Expected finding: kind=...`,
the format tests/scenarios/test_samples.py runs), so a new kind cannot ship without either. A
finding's in-run identity (`merge_key`) and its cross-run one (`fingerprint`) are the same
facts, named exactly or portably.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pallas_check.findings.finding import (CATALOGUE, Access, Finding, FindingKind, KernelInfo,
                                   SourceFrame)

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
_STATED = re.compile(r"^\s*Expected finding:\s*kind=([\w-]+)", re.MULTILINE)

# Kinds no `*_bug.py` states, each with why (none today: keep it that way).
WITHOUT_SAMPLE: dict[FindingKind, str] = {}


def _stated_kinds() -> dict[str, list[str]]:
    """Kind name -> the buggy samples whose docstring states a finding of that kind."""
    stated: dict[str, list[str]] = {}
    for path in sorted(SAMPLES.glob("*_bug.py")):
        for kind in _STATED.findall(path.read_text()):
            stated.setdefault(kind, []).append(path.name)
    return stated


@pytest.mark.parametrize("kind", list(FindingKind), ids=lambda k: k.value)
def test_every_kind_has_a_catalogue_entry(kind):
    info = CATALOGUE[kind]
    assert kind.info is info
    assert info.title and info.short and info.help
    assert re.fullmatch(r"[A-Z][A-Za-z]+", info.sarif_name), info.sarif_name
    assert info.severity in ("error", "warning", "note")


def test_catalogue_names_only_kinds_and_unique_rules():
    assert set(CATALOGUE) == set(FindingKind)
    names = [info.sarif_name for info in CATALOGUE.values()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("kind", list(FindingKind), ids=lambda k: k.value)
def test_every_kind_has_a_buggy_sample(kind):
    samples = _stated_kinds().get(kind.value, [])
    if kind in WITHOUT_SAMPLE:
        assert not samples, f"{kind.value} has a sample now: drop it from WITHOUT_SAMPLE"
        return
    assert samples, (f"no samples/*_bug.py states `Expected finding: kind={kind.value}`"
                     " (add a _bug/_ok pair, tests/scenarios/test_samples.py runs it)")
    for name in samples:
        assert (SAMPLES / name.replace("_bug.py", "_ok.py")).exists(), name


def test_samples_state_only_known_kinds():
    assert set(_stated_kinds()) <= {kind.value for kind in FindingKind}


def _finding(tmp_path: Path, line: int, code: str = "x[i] = 1") -> Finding:
    frame = SourceFrame(str(tmp_path / "k.py"), line, "kernel", code)
    return Finding(FindingKind.OUT_OF_BOUNDS, "out of bounds", KernelInfo("k", frame.file, 3),
                   0, buffer="x_ref", memory_space="VMEM", frames=(frame,),
                   accesses=(Access("write", "kernel", "x_ref", frames=(frame,)),))


def test_merge_key_and_fingerprint_are_one_identity(tmp_path):
    here, moved = _finding(tmp_path, 10), _finding(tmp_path, 13)
    # Within a run a line is exact: the same code on another line is another sighting.
    assert here.merge_key() == _finding(tmp_path, 10).merge_key()
    assert here.merge_key() != moved.merge_key()
    # Across runs a line is its text: the finding that moved keeps its fingerprint,
    # wherever the project is checked out.
    assert here.fingerprint(str(tmp_path)) == moved.fingerprint(str(tmp_path))
    # A fact of the identity changes both.
    changed = _finding(tmp_path, 10, code="x[j] = 1")
    assert changed.fingerprint(str(tmp_path)) != here.fingerprint(str(tmp_path))
    assert changed.merge_key() != here.merge_key()


def test_fingerprints_of_earlier_baselines_still_match():
    """The hash is what every baseline file holds: these values are those the SARIF
    report's `fingerprint` gave before it moved to findings/finding.py."""
    code = SourceFrame("/proj/pkg/k.py", 10, "kernel", "x[i] = 1")
    helper = SourceFrame("/elsewhere/v.py", 7, "helper", "")
    race = Finding(FindingKind.RACE, "race", KernelInfo("k", "/proj/pkg/k.py", 3), 0,
                   buffer="x_ref", memory_space="VMEM", frames=(code,),
                   accesses=(Access("DMA write", "dma", "x_ref", frames=(helper,)),
                             Access("read", "core 0", "x_ref", frames=(code,))))
    vmem = Finding(FindingKind.VMEM_EXCEEDED, "big", KernelInfo("k2", "/proj/k 2.py", 3), 1,
                   merge="v5e VMEM 123")
    assert race.fingerprint("/proj") == "505dd33dc0d1c51e271da514214da8dc"
    assert vmem.fingerprint("/proj") == "574c41bd6f79c6259dd86a186f02b479"
