"""Tests of pallas_check/process/."""
