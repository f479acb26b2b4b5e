#!/usr/bin/env bash
# Session 33's third call on the TPU v5e: how the MXU adds a product's float32 terms
# (hardware/probes/mxu_order.py), the flash attention scores of the calls that still
# differ, and dense grids of tanh, log, sqrt, rsqrt.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
( time timeout 400 python3 hardware/probes/mxu_order.py ) 2>&1 | grep -v -i "warn" | tail -20
ls -la $OUT
