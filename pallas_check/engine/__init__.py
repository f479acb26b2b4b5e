"""The simulated TPU: one pallas_call's buffers, grid walk, DMAs, semaphores and actors.

It produces outputs and findings and prints nothing; see ARCHITECTURE.md.
"""
