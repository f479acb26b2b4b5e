"""The benchmark's kernel repository (benchmarks/kernel_suite) as one script, for `record`.

`pallas-check record` runs a script; this one runs the kernel repository's 85 TPU-gated
tests with pytest in-process, so that on a TPU every `pallas_call` of every test is recorded
(operands and the chip's outputs) into one file, and `pallas-check replay` then checks the
simulation against what the chip computed for twenty-odd kernel families (paged and ragged
attention, grouped and quantized matmuls, KV-cache updates, gathers, ...) on any CPU.
Arguments after the script's name go to pytest (e.g. `-k paged`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_suite"

if __name__ == "__main__":
    os.chdir(SUITE)
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests", *sys.argv[1:]]))
