"""Tests of pallas_check/tpu_compile/: compiles for real TPU generations, kernels that do not
lower."""
