"""Tests of pallas_check/findings/: every kind has its catalogue entry and samples."""
