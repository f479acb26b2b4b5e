"""Tests of pallas_check/deliver/."""
