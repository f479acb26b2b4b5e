"""Rules for the SparseCore primitives of a kernel jaxpr (`jax.experimental.pallas.tpu_sc`,
issue 28): subcore barriers and synchronisation, vector ops (gathers, scatters, compressed
loads and stores, scans, sorts, packing) and `parallel_loop`.

Rules register by primitive OBJECT (jaxpr/registry.py): SparseCore primitives share their
names with others (`load`, `swap`, `gather`, `scatter`, `bitcast`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pallas_check.engine.jaxpr.registry import rule


# -- barrier / sync (SC-C)


# -- vector ops (SC-B)


# -- parallel_loop (SC-C)
