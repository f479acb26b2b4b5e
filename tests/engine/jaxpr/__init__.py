"""engine/jaxpr/: generated programs, scalar segments, segment order, the rule registry."""
