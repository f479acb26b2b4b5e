"""Pallas TPU kernels: attention variants, matmuls, cache updates, layouts, small kernels.

Each module holds one family's kernels and their wrappers; `runtime` says whether the
process runs on a TPU and whether the tests asked for an interpreter instead."""
