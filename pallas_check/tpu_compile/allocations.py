"""A call's VMEM allocations by the kernel's own names: the reckoning lives in
engine/call/footprint.py (the engine checks every call against the chip's capacity with it
before simulating it); re-exported here for the compile stage."""

from pallas_check.engine.call.footprint import (
    Allocation,
    allocations,
    format_bytes,
    scratch_bytes,
    tiled_bytes,
)
