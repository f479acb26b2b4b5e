"""Our rules for the primitives that touch refs, DMAs, semaphores and control flow: memory
accesses (access.py, index_plan.py), control flow and the grid (control.py), DMAs (dma.py),
semaphores (semaphore.py), debug checks and prints (debug.py). A rule module registers its
rules in jaxpr/registry.py when imported (call/simulate.py imports them all)."""
