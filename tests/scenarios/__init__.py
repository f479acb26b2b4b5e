"""End-to-end scenarios: every sample, kernels people write, the kernels JAX ships, through the
real CLI."""
