"""Which JAX versions the bridge knows, checked once when the bridge is imported.

pallas-check reads JAX's private modules, so a JAX it was not written for could make it
check something different without saying so. A version outside the range below is refused
with one line naming the range (exit 2 through the command line's error path), never run.
Each version difference inside the range is handled in this package, once (see `types.py`
for types a version lacks, `call.py` for compiler params), with a test per difference in
tests/jaxbridge/.
"""

from __future__ import annotations

import re

# Inclusive. Tested: 0.9.2 (the samples that use no 0.10-only API) and 0.10.2 (everything);
# pyproject.toml pins the same range (tests/jaxbridge/test_version.py holds them equal).
OLDEST = (0, 9, 2)
NEWEST = (0, 10, 2)
TESTED = ("0.9.2", "0.10.2")
SUPPORTED = f">={'.'.join(map(str, OLDEST))},<={'.'.join(map(str, NEWEST))}"


class UnsupportedJax(Exception):
    """The installed JAX is outside the range the bridge knows: one line, exit 2 (USAGE).
    Not a `PallasCheckError`: the bridge depends on nothing of pallas-check's (an
    import-linter contract), so the command line's `_one_line` knows it by
    `pallas_check_error`."""

    pallas_check_error = True
    exit_code = 2  # ExitCode.USAGE


def parse(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a JAX version string ('0.10.2', '0.10.2.dev20260101'), or
    None when it is not one."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def check(version: str) -> None:
    """Raise UnsupportedJax unless `version` is in the supported range."""
    parsed = parse(version)
    if parsed is None or not OLDEST <= parsed <= NEWEST:
        raise UnsupportedJax(f"jax {version} is not supported: pallas-check reads JAX's"
                             f" internals and knows jax {SUPPORTED} (tested:"
                             f" {', '.join(TESTED)}); install one of those")


def compiled_tier_refusal(version: str) -> str | None:
    """Why this JAX cannot run the compiled tier, or None when it can. jaxlib 0.9.2's XLA
    segfaults compiling a computation from inside a pallas_call's host callback (seen on
    samples/oob_dma_ok.py), which is where the compiled tier compiles: on 0.9 every call
    runs on the engine, with this reason in the report."""
    parsed = parse(version)
    if parsed is not None and parsed < (0, 10, 0):
        return "jax < 0.10 (its XLA crashes compiling the call inside the host callback)"
    return None
