"""engine/memory/: buffers and lending, regions and bounds, reshape/bitcast views, the access
cache."""
