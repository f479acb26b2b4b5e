"""pallas-check: run Pallas TPU kernels on a CPU under a checking interpreter."""

__version__ = "0.1.0"
