"""Tests of the Python entry points: the API (api.py) and the pytest plugin
(pytest_plugin.py)."""
