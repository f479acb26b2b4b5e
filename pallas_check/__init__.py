"""pallas-check: run Pallas TPU kernels on a CPU under a checking interpreter.

`pallas_check.checking(...)` checks the pallas_calls of a block of code (api.py); the
package itself imports nothing heavy (the pytest plugin and the CLI import it first).
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["FindingsError", "Run", "checking"]


def __getattr__(name: str) -> Any:
    """The Python API, imported when first used (it brings JAX with the engine)."""
    if name in __all__:
        from pallas_check import api

        return getattr(api, name)
    raise AttributeError(f"module 'pallas_check' has no attribute {name!r}")
