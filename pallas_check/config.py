"""Run configuration: one frozen value passed from the CLI down to the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class DmaMode(str, enum.Enum):
    """When a DMA's copy happens relative to its start and its wait."""

    EAGER = "eager"  # the copy is done when the DMA starts
    ON_WAIT = "on_wait"  # the copy is done when its semaphore is waited on
    RANDOM = "random"  # read and write at scheduler-chosen points between start and wait


class UninitFill(str, enum.Enum):
    """What never-written memory (scratch, outputs, padding) holds."""

    NAN = "nan"
    ZERO = "zero"


class TpuGeneration(str, enum.Enum):
    """The TPU that kernels asking which chip they run on are told about."""

    V5E = "v5e"
    V6E = "v6e"
    V7X = "v7x"


DEFAULT_TPU = TpuGeneration.V5E


@dataclass(frozen=True)
class Config:
    """Options of one checking run; defaults match `pallas-check run` with no flags."""

    dma_mode: DmaMode = DmaMode.ON_WAIT
    uninit: UninitFill = UninitFill.NAN
    skip_floats: bool = False
    tpu: TpuGeneration = DEFAULT_TPU
    devices: int = 1
    cores: int = 1  # TensorCores per device; 'parallel' grid axes are split over them
    seed: int = 0  # scheduler seed: the same seed gives the same interleaving
    races: bool = False  # happens-before race detection (costs a little per access)
    schedules: int = 1  # seeds seed, seed+1, ... tried per call (schedule exploration)
    keep_going: bool = False  # with schedules > 1: try them all, not stop at a finding
    # Whether to re-run a call whose kernel read never-written memory, with another fill,
    # to tell which outputs that memory reached.
    check_uninit_outputs: bool = True
    timeline: bool = False  # record each call's timeline (--trace FILE; engine/timeline.py)
