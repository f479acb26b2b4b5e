"""Simulated TPU memory: buffers and their written-shadow (buffer.py), ref views through
transforms (views.py), where an access lands (region.py), and the per-call cache of
resolved accesses (access_cache.py). Imports nothing else of the engine."""
