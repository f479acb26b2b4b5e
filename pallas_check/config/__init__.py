"""Configuration of a checking run: one package for one concern.

- `model.py`: the value itself, `Config` (one frozen value from the CLI down to the engine),
  and the choices it is made of (`DmaMode`, `Tier`, `UninitFill`,
  `TpuGeneration`).
- `options.py`: the option table: every option of `run`, `diff` and `compile` declared
  once, with the names derived from it (flag, `[tool.pallas-check]` key, `PALLAS_CHECK_*`
  variable), and `config_from`, the one way a `Config` is built from option values.
- `layers.py`: where values come from, lowest first: the option's default < the
  `[tool.pallas-check]` table of pyproject.toml < `PALLAS_CHECK_*` variables < flags.
- `environment.py`: the names of our environment variables (`PALLAS_CHECK_` + an option's
  key, and PALLAS_CHECK_DEBUG), in one place.

This package's own namespace holds the model only: the engine imports `Config` from here,
and must not pull in the option table (which names report formats) or the layers with it.
Callers that need the table or the layers import `pallas_check.config.options` or
`pallas_check.config.layers`. Nothing here imports JAX.
"""

from pallas_check.config.model import (DEFAULT_TPU, Config, DmaMode, Tier, TpuGeneration,
                                       UninitFill, parse_generations)

__all__ = ["DEFAULT_TPU", "Config", "DmaMode", "Tier", "TpuGeneration", "UninitFill",
           "parse_generations"]
