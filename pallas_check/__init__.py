"""pallas-check: run Pallas TPU kernels on a CPU under a checking interpreter.

`pallas_check.checking(...)` checks the pallas_calls of a block of code (api.py);
`pallas_check.simulated_tpu(...)` tells kernels which TPU they run on. The
package itself imports nothing: the CLI, the pytest plugin and the reporters import it
(for `__version__`) long before, or without, any use of the API.
"""

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = ["FindingsError", "Run", "checking", "simulated_tpu"]


def __getattr__(name: str) -> Any:
    """The Python API's names, from api.py when first asked for (it brings the engine and
    JAX). Looked up by name, not imported here: the reporters that read `__version__`
    from this package must not depend on the session and engine behind the API."""
    if name in __all__:
        return getattr(importlib.import_module("pallas_check.api"), name)  # lazy: api brings JAX
    raise AttributeError(f"module 'pallas_check' has no attribute {name!r}")
