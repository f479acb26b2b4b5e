"""Answer kernels that ask which TPU they run on with a simulated generation."""

from __future__ import annotations

import contextlib
from typing import Iterator

from pallas_check.config import TpuGeneration


@contextlib.contextmanager
def simulated_tpu(generation: TpuGeneration) -> Iterator[None]:
    """While active, TPU-generation queries see `generation` (placeholder: no patching yet)."""
    yield
