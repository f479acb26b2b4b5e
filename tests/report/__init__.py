"""Tests of pallas_check/report/ and report/suppress.py: every format, the timeline, suppressions and
baselines."""
