"""Answer kernels that ask which TPU they run on with a simulated generation.

`pltpu.get_tpu_info()`, `pltpu.is_tpu_device()` and `pltpu.emit_pipeline` (through its
tiling inference) read the device kind of the default device, which is a CPU here. While a
run is active they see the generation chosen with `--tpu` instead.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from pallas_check.jaxbridge import jax_tpu_info

from pallas_check.config import TpuGeneration, parse_generations

DEVICE_KINDS = {
    TpuGeneration.V5E: "TPU v5 lite",
    TpuGeneration.V5P: "TPU v5",
    TpuGeneration.V6E: "TPU v6 lite",
    TpuGeneration.V7X: "TPU7x",
}


def _clear_caches() -> None:
    for fn in (jax_tpu_info.get_tpu_info,):
        clear = getattr(fn, "cache_clear", None)
        if clear is not None:
            clear()


@contextlib.contextmanager
def simulated_tpu(generation: TpuGeneration | str, cores: int = 1) -> Iterator[None]:
    """While active, TPU-generation queries see `generation` (the first of a `--tpu` list)
    with `cores` TensorCores."""
    generation = parse_generations(generation)[0]
    saved = (jax_tpu_info.get_device_kind, jax_tpu_info.get_num_device_cores)
    jax_tpu_info.get_device_kind = lambda: DEVICE_KINDS[generation]
    jax_tpu_info.get_num_device_cores = lambda: cores
    _clear_caches()
    try:
        yield
    finally:
        jax_tpu_info.get_device_kind, jax_tpu_info.get_num_device_cores = saved
        _clear_caches()
