"""Tests of pallas_check/engine/, one folder per wing (call/, memory/, dma/, jaxpr/, rules/,
runtime/)."""
