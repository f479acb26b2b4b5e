"""Which calls the compiled tier may run, decided from the call's static description.

The tier models one core running a grid in order, its own DMAs and semaphores, and the
BlockSpec pipeline (an edge block's padding as never-written memory). What it does not model runs on the
engine, and the reason is the call's `tier_reason` in the report:

- several devices or cores, SparseCore meshes, `core_map` kernels (other actors: the
  schedules and the races between them are the engine's);
- `--dma random` or several `--schedules` (interleavings are the engine's);
- `--skip-floats`, `--trace` (the engine's timeline);
- scalar-prefetch-free dynamic grids, vmap's grid axes, a reordered grid;
- `pl.Element` and bounded dims, blocks with ref transforms or a `pl.Buffered` pipeline mode, input/output
  aliases, semaphore operands (semaphores carried between calls);
- inputs made by `jnp.empty` (never-written memory the engine tracks);
- a kernel Mosaic would not lower (the engine reports it as a compile error).

What the kernel body does is decided while tracing it (`tracing.Unsupported`): a remote
DMA, a print, an index array, a ref transform other than indexing, ...
"""

from __future__ import annotations

from typing import Collection

import jax

from pallas_check.config import Config, DmaMode
from pallas_check.engine.call.describe import dimension_semantics, is_semaphore_aval
from pallas_check.engine.call.explore import mosaic_refusal
from pallas_check.jaxbridge.keys import is_key_aval
from pallas_check.jaxbridge.version import compiled_tier_refusal
from pallas_check.jaxbridge.call import Block, CallDescription, CallParams, describe


# The running JAX may not compile inside a host callback (jaxbridge/version.py).
_JAX_REFUSAL = compiled_tier_refusal(jax.__version__)

# Block dimensions the pipeline model does not cover, as the user spelled them.
_DIM_KINDS = {"element": "a pl.Element block dimension",
              "bounded": "a pl.BoundedSlice block dimension"}


def ineligible(params: CallParams, config: Config, devices: int,
               never_written: Collection[int] = ()) -> str | None:
    """Why the call must run on the engine, or None when the compiled tier may run it
    (the kernel body may still turn out to need the engine while it is traced)."""
    if devices != 1:
        return f"{devices} devices"
    found = _options(config) or _call(describe(params), params, config)
    if found is None and never_written:
        found = "an input made by jnp.empty"
    if found is None and mosaic_refusal(params, config) is not None:
        found = "Mosaic does not lower the kernel"
    return found


def _options(config: Config) -> str | None:
    if _JAX_REFUSAL is not None:
        return _JAX_REFUSAL
    if config.dma_mode not in (DmaMode.ON_WAIT, DmaMode.EAGER):
        return f"--dma {DmaMode(config.dma_mode).value}"
    if config.schedules > 1:
        return f"--schedules {config.schedules}"
    if config.skip_floats:
        return "--skip-floats"
    if config.timeline:
        return "--trace"
    return None


def _call(call: CallDescription, params: CallParams, config: Config) -> str | None:
    if call.mesh is not None:
        return "a core mesh"
    if config.cores > 1 and any("parallel" in s for s in dimension_semantics(params)):
        return f"{config.cores} cores"
    if call.batch_axes:
        return "vmap's grid axes"
    if call.num_grid_bounds or not all(isinstance(n, int) for n in call.grid):
        return "a dynamic grid"
    if call.custom_grid_order:
        return "a reordered grid"
    if call.aliases:
        return "input_output_aliases"
    if call.kernel.constvars:
        return "kernel constants"
    for block in call.blocks:
        found = _block(block)
        if found is not None:
            return found
    return None


def _block(block: Block) -> str | None:
    if is_semaphore_aval(block.kernel_aval):
        return "a semaphore operand"
    if is_key_aval(block.kernel_aval):
        return "a typed PRNG key operand"
    if block.transformed:
        return "a block with ref transforms"
    if block.pipeline_mode is not None:
        return "a pipeline mode (pl.Buffered)"
    if pipelined(block) is False:
        return None  # not pipelined: the kernel's own DMAs reach it
    for dim in block.dims:
        if dim.kind not in ("blocked", "squeezed"):
            return _DIM_KINDS.get(dim.kind, "a block dimension of another kind")
    return None


def pipelined(block: Block) -> bool:
    """Whether the BlockSpec pipeline copies the operand's blocks to and from VMEM/SMEM
    (else the kernel sees the array where it lies, in HBM, and reaches it by DMA)."""
    return str(block.memory_space).lower().rsplit(".", 1)[-1] not in ("any", "hbm")
