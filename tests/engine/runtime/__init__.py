"""engine/runtime/: the scheduler, schedule exploration and replay, determinism."""
