"""pytest plugin that benchmarks/kernel_suite_bench.py loads (`-p _kernel_suite_plugin`)
when it runs the kernel suite under one of JAX's interpreters.

The suite's kernels and JAX's vendored ones may ask which TPU they run on (`emit_pipeline`
reads the chip's VMEM size, wrappers read `device_kind`); on a bare CPU they would fail
for a reason that has nothing to do with the interpreter. So for the whole session the
process is told it runs on the chip `KERNEL_SUITE_TPU` names (default v5e), as
`pytest --pallas-check` tells it (`pallas_check.simulated_tpu`, public API), while XLA
runs on the CPU. The pallas-check runs do not load this plugin: theirs answers already.

With `KERNEL_SUITE_CLEAR_CACHES=1` (the benchmark's `tpu-races-cleared` mode) JAX's caches
are cleared before and after each test, as `pytest --pallas-check` does when it installs
and removes its interception around each test: every jitted function a test calls (its
kernels' wrappers and its references alike) is traced and compiled again, so that mode
shows what that costs JAX's interpreter.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import pytest

import pallas_check

CHIP_VARIABLE = "KERNEL_SUITE_TPU"
CLEAR_VARIABLE = "KERNEL_SUITE_CLEAR_CACHES"


def pytest_configure(config: pytest.Config) -> None:
    stack = contextlib.ExitStack()
    stack.enter_context(pallas_check.simulated_tpu(os.environ.get(CHIP_VARIABLE, "v5e")))
    config.add_cleanup(stack.close)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if os.environ.get(CLEAR_VARIABLE) != "1":
        return (yield)
    import jax

    jax.clear_caches()
    try:
        return (yield)
    finally:
        jax.clear_caches()
