"""engine/rules/: the rules of Pallas primitives (index plans, control flow, accesses, DMAs,
semaphores)."""
