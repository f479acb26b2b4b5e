"""Tests of pallas_check/checkers/: each detector's contract, findings of the right kind at the
right line."""
