"""Where a script's pallas_calls are caught: the patched lowering (patched_lowering.py,
operands lent by hostcall.py), the session that hands each call to the engine
(session.py), which calls are checked (call_filter.py, xla_path.py), the
program around them (outer.py, judge.py, empties.py), the simulated TPU
the script asks about (tpu_info.py) and the runs of further generations
(generations.py)."""
