#!/usr/bin/env bash
# Session 33's first call on the TPU v5e: the chip's exp, exp2, bfloat16 functions and
# float32 division, densely (hardware/probes/exp_bits.py), to model them bit for bit.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
( time timeout 420 python3 hardware/probes/exp_bits.py ) 2>&1 | tail -50
ls -la $OUT
