"""pytest plugin that benchmarks/kernel_suite_bench.py loads (`-p _kernel_suite_plugin`)
when it runs the kernel suite under one of JAX's interpreters.

The suite's kernels and JAX's vendored ones may ask which TPU they run on (`emit_pipeline`
reads the chip's VMEM size, wrappers read `device_kind`); on a bare CPU they would fail
for a reason that has nothing to do with the interpreter. So for the whole session the
process is told it runs on the chip `KERNEL_SUITE_TPU` names (default v5e), as
`pytest --pallas-check` tells it (`pallas_check.simulated_tpu`, public API), while XLA
runs on the CPU. The pallas-check runs do not load this plugin: theirs answers already.
"""

from __future__ import annotations

import contextlib
import os

import pytest

import pallas_check

CHIP_VARIABLE = "KERNEL_SUITE_TPU"


def pytest_configure(config: pytest.Config) -> None:
    stack = contextlib.ExitStack()
    stack.enter_context(pallas_check.simulated_tpu(os.environ.get(CHIP_VARIABLE, "v5e")))
    config.add_cleanup(stack.close)
