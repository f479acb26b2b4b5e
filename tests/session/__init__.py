"""Tests of the session and interception (session.py, intercept.py, hostcall.py): how a user's
program reaches the engine."""
