"""Checkers turn engine events into findings while the kernel runs (one module each)."""
