"""Tests of pallas_check/config/: options on every surface, their layers and precedence."""
