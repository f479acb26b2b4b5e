"""A plain program found before lowering (jaxbridge/program_identity.py, through
jaxbridge/program_store.py): programs that differ only in what their printed jaxpr does not
show -- a large constant's values, a literal, a weak type, donation, JAX's settings, a
nested jaxpr -- are never taken for one another. Each variant runs in a second process
after the first filled the store with the other (tests/jaxbridge/_program_cases.py), and
must compute its own numpy reference, having been keyed (it missed: it was not refused,
and not found). Programs the key refuses (Python callbacks, a primitive of the script's
with its own lowering) are never keyed and still compute what they should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

CASES = Path(__file__).resolve().parent / "_program_cases.py"
ROOT = Path(__file__).resolve().parents[2]

KEYED = ["large_constant", "large_numpy_constant", "literal", "dtype", "weak_type",
         "donation", "x64", "matmul_precision", "chip_rounding", "branch",
         "branch_constant", "loop_literal"]
REFUSED = ["own_primitive", "pure_callback", "debug_print"]


def run_cases(cache: Path, variant: str, names: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(CASES), str(cache), variant, *names],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def _computes_its_reference(found: dict, name: str) -> None:
    assert found["dtype"] == found["want_dtype"], (name, found)
    np.testing.assert_allclose(np.asarray(found["out"]), np.asarray(found["want"]),
                               rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A store filled by a process that ran every case's variant a."""
    cache = tmp_path_factory.mktemp("programs")
    return cache, run_cases(cache, "a", KEYED + REFUSED)


def test_the_first_process_keys_and_keeps_each_program(filled):
    cache, first = filled
    for name in KEYED:
        assert first[name]["identity_misses"] == 1 and first[name]["identity_refused"] == 0, (
            name, first[name])
        _computes_its_reference(first[name], name)
    assert list((cache / "programs").glob("*.xla"))


def test_the_same_programs_are_found_without_lowering(filled):
    """The control: the same variant in a second process is found, lowered by no one."""
    cache, _ = filled
    again = run_cases(cache, "a", KEYED)
    for name in KEYED:
        found = again[name]
        assert (found["identity_hits"], found["identity_misses"]) == (1, 0), (name, found)
        assert found["lowered"] == [], (name, found)
        _computes_its_reference(found, name)


@pytest.mark.parametrize("name", KEYED)
def test_a_program_differing_only_unseen_is_not_taken_for_the_other(filled, name):
    cache, first = filled
    found = run_cases(cache, "b", [name])[name]
    assert found["identity_hits"] == 0 and found["identity_misses"] == 1, found
    _computes_its_reference(found, name)
    if name not in ("matmul_precision", "donation", "weak_type"):  # (the same values)
        assert found["out"] != first[name]["out"]
    if name == "weak_type":
        assert (first[name]["weak"], found["weak"]) == (True, False)
    if name == "donation":
        assert found["operand_after"] is not None  # (not donated: still readable)


@pytest.mark.parametrize("variant", ["a", "b"])
def test_refused_programs_are_never_keyed_and_still_run(filled, variant):
    """A primitive of the script's whose lowering changed between the processes, a
    pure_callback, a debug print: lowered every time, computing what they should."""
    cache, first = filled
    found = run_cases(cache, variant, REFUSED)
    for name in REFUSED:
        for run in (first[name], found[name]):
            assert run["identity_refused"] >= 1, (name, run)
            assert run["identity_hits"] == run["identity_misses"] == 0, (name, run)
            assert run["lowered"], (name, run)
        _computes_its_reference(found[name], name)
