"""Tests of pallas_check/commands/: `diff` and `run --native`."""
