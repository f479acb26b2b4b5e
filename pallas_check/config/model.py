"""Run configuration: one frozen value passed from the CLI down to the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class DmaMode(str, enum.Enum):
    """When a DMA's copy happens relative to its start and its wait."""

    EAGER = "eager"  # the copy is done when the DMA starts
    ON_WAIT = "on_wait"  # the copy is done when its semaphore is waited on
    RANDOM = "random"  # read and write at scheduler-chosen points between start and wait


class Tier(str, enum.Enum):
    """Which way a checked call runs. AUTO: the compiled tier (the call as one XLA
    computation, `pallas_check/compiled/`) where the call is eligible, else the engine;
    ENGINE: always the engine, the reference every other way is held to; COMPILED: the
    compiled tier, and a call it cannot run is a one-line error (`TierRefused`), so a user
    who asked for it learns why instead of silently getting the engine."""

    AUTO = "auto"
    ENGINE = "engine"
    COMPILED = "compiled"


class UninitFill(str, enum.Enum):
    """What never-written memory (scratch, outputs, padding) holds."""

    NAN = "nan"
    ZERO = "zero"


class TpuGeneration(str, enum.Enum):
    """The TPU that kernels asking which chip they run on are told about."""

    V5E = "v5e"
    V5P = "v5p"
    V6E = "v6e"
    V7X = "v7x"


DEFAULT_TPU = TpuGeneration.V5E


def parse_generations(value: "str | TpuGeneration") -> tuple[TpuGeneration, ...]:
    """`--tpu v5e,v6e,v7x` as generations, in order, without repeats (ValueError when a
    name is not one of ours). The first is the one the simulation tells kernels about."""
    if isinstance(value, TpuGeneration):
        return (value,)
    names = [n.strip().lower() for n in str(value).split(",") if n.strip()]
    known = {g.value: g for g in TpuGeneration}
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"--tpu {value!r}: expected one or more of"
                         f" {', '.join(known)} separated by commas")
    return tuple(dict.fromkeys(known[n] for n in names))


@dataclass(frozen=True)
class Config:
    """Options of one checking run; defaults match `pallas-check run` with no flags."""

    dma_mode: DmaMode = DmaMode.ON_WAIT
    uninit: UninitFill = UninitFill.NAN
    skip_floats: bool = False
    # One generation, or several separated by commas ("v5e,v6e"): the first is the one
    # kernels are told they run on; --compile compiles for each (parse_generations).
    tpu: TpuGeneration | str = DEFAULT_TPU
    devices: int = 1
    cores: int = 1  # TensorCores per device; 'parallel' grid axes are split over them
    seed: int = 0  # scheduler seed: the same seed gives the same interleaving
    races: bool = True  # happens-before race detection (--no-races: off; costs per access)
    schedules: int = 1  # seeds seed, seed+1, ... tried per call (schedule exploration)
    keep_going: bool = False  # with schedules > 1: try them all, not stop at a finding
    compile: bool = False  # also compile every call for the real TPUs named by `tpu`
    # Each distinct call compiled for the first generation of `tpu` as it is lowered, where
    # libtpu is installed (intercept/chip.py): what the chip refuses is a finding and raises
    # in the program. On in `run`, the plugin and the API (config/options.py `--no-compile`
    # turns it off); off in a Config built directly (the engine's own tests).
    chip_compile: bool = False
    # Arithmetic as the TPU computes it where it differs beyond noise (float32 products'
    # operands rounded to bfloat16 at the default precision, the approximate reciprocal;
    # jaxbridge/chip_arithmetic.py), in the kernels and in the program alike. On in `run`,
    # the plugin and the API (`--exact-arithmetic` turns it off); off in a Config built
    # directly.
    chip_arithmetic: bool = False
    # With chip_arithmetic: exp, exp2, float32 division and reciprocals and the logistic as
    # the v5e computes them, bit for bit (jaxbridge/chip_exp.py, chip_divide.py); off by
    # default in `run` and the plugin (each such operation costs XLA:CPU compile time in
    # every program), always on in `diff` and `replay`, where the chip is the reference.
    chip_functions: bool = False
    # Several generations in `tpu`: each further one's own trace (the script run again as
    # that chip) simulated and checked too, not only compiled.
    tpu_all: bool = False
    quiet_prints: bool = False  # drop the kernels' own prints (pl.debug_print)
    # Filters (intercept/call_filter.py): check only kernels whose name matches one of these globs
    # (none: every kernel), and only the first `calls` calls of each kernel, shapes and
    # static parameters (0: every call); the other calls run unchecked.
    kernels: tuple[str, ...] | list[str] | None = None
    calls: int = 0
    # Whether to re-run a call whose kernel read never-written memory, with another fill,
    # to tell which outputs that memory reached.
    check_uninit_outputs: bool = True
    timeline: bool = False  # record each call's timeline (--trace FILE; engine/timeline.py)
    # With a timeline: the marks a call records before only its findings are (0: all).
    trace_limit: int = 1_000_000
    tier: Tier = Tier.AUTO  # which way each checked call runs (Tier)
