"""Tests of pallas_check/report/ and suppress.py: every format, the timeline, suppressions and
baselines."""
