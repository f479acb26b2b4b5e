"""Evaluating a kernel jaxpr: the rule registry (registry.py), programs generated from a
jaxpr with compiled pure segments (program.py, segment_order.py, scalar.py), the errors a
simulation stops on (errors.py), and what Mosaic would refuse to lower (mosaic_limits.py)."""
