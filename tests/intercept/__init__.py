"""Tests of the session and interception (intercept/session.py, intercept/patched_lowering.py, intercept/hostcall.py): how a user's
program reaches the engine."""
