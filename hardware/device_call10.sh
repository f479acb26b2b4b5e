#!/usr/bin/env bash
# Session 33's second call on the TPU v5e: pallas-check's model of the chip's exp2/exp
# (pallas_check/jaxbridge/chip_exp.py) against the chip on every float32 bit pattern, and
# the chip's reciprocal densely with candidate refinements (hardware/probes/exp_verify.py).
set -u
cd "$(dirname "$0")/.."
source hardware/device_install.sh
( time EXHAUSTIVE_SECONDS=${EXHAUSTIVE_SECONDS:-90} timeout 480 python3 hardware/probes/exp_verify.py ) 2>&1 \
  | grep -v -i "warn" | tail -40
ls -la $OUT
