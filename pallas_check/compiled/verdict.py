"""What a compiled run says of a call: one bit per kind of trouble it saw.

Each bit is a reason to hand the call to the engine, never a finding: the engine runs it
again and says exactly what happened. A bit may be set where the engine then finds
nothing (the tier is conservative: a never-written element read and never used, a DMA
table that filled up); it is never clear where the engine would find something.
"""

from __future__ import annotations

import enum


class Verdict(enum.IntFlag):
    """The verdict bits (an int32 in the computation's result)."""

    CLEAR = 0
    OUT_OF_BOUNDS = 1  # an access, a block or a DMA box outside its buffer
    UNINITIALIZED = 2  # a read (or a DMA) of elements never written
    WAIT_UNMET = 4  # a wait its semaphore cannot meet (one core: nothing else signals)
    SEMAPHORE_LEFT = 8  # a semaphore not zero at the kernel's end
    DMA_NOT_WAITED = 16  # a DMA no wait took at the kernel's end
    UNWRITTEN_OUTPUT = 32  # output elements nothing wrote
    TABLE_FULL = 64  # more DMAs in flight than the table holds
    RACE = 128  # races on: an access or DMA overlapping a DMA in flight
    REVISIT = 256  # an output block visited again after other blocks
    UNTOUCHED = 512  # scratch the kernel left partly untouched (the engine's note)
    COUNT_AHEAD = 1024  # a DMA's wait whose count was met before the DMA landed (dma.py)
    # A stochastic_round whose random words keep too many of the bits the chip reads fixed
    # (engine/rules/conversions.py `bits_read`: the engine's random-misuse, exactly).
    RANDOM_BITS_FIXED = 2048


def describe(bits: int) -> str:
    """The set bits as words, for a call's `tier_reason` ("out-of-bounds, race")."""
    names = [flag.name.lower().replace("_", "-") for flag in Verdict
             if flag and bits & flag and flag.name]
    return ", ".join(names) or "clear"
