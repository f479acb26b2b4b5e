"""The compiled tier: a whole checked pallas_call as one XLA computation.

The engine (`pallas_check/engine/`) interprets a call a grid step and an equation at a
time, in Python; its cost is flat per step and per DMA whether or not any check fires.
Most calls of a correct kernel find nothing. For a call that is eligible (one device, one
core, `on_wait` or `eager`, every access and DMA a box: `eligibility.py`), this package
traces the grid loop, the BlockSpec pipeline and the kernel body into one jitted
computation (`program.py`) that carries every buffer as its value and its written-shadow,
the semaphores as counts and the DMAs in flight as a fixed-size table (`machine.py`), and
returns the outputs and a verdict: a bit per kind of trouble (`verdict.py`).

The tier writes no finding. A call whose verdict is clear found nothing the engine would
report; a call with any bit set is run again on the engine, which stays the reference
and reports it with frames, ranges and grid points (`intercept/session.py` chooses).
"""
