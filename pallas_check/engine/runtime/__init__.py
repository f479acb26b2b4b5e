"""What the simulation runs on: the cooperative scheduler of actors (scheduler.py), the
rendezvous of devices run in lockstep (rendezvous.py), the JAX backend for compiled
segments (backend.py), progress and heartbeats (progress.py), what a call found so far
(inflight.py) and bounded caches (caches.py)."""
