"""engine/call/: a pallas_call described and simulated, its BlockSpec pipeline, capacity,
revisits, state carried between calls."""
