"""One pallas_call: its static description (describe.py), the exploration of its schedules
and the second-fill re-run (explore.py), the simulation of one schedule (simulate.py), the
run-time state shared by its cores (state.py), each core's BlockSpec pipeline
(pipeline.py), revisits (revisit.py), semaphores carried between calls (carried.py), and
the VMEM capacity check (capacity.py, footprint.py)."""
