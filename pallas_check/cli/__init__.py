"""The command line: the `pallas-check` commands (app.py) and the pre-commit hook
(hook.py). Imports nothing here: `--devices` must reach XLA_FLAGS before JAX."""
