"""One checked run: the runner (install, run the script, report, exit code), the
processes it spawns (spawned.py), the options of the Python API and the pytest
plugin resolved (api_options.py)."""
