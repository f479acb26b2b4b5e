"""Tests of the command line (cli/app.py, runner, outfile, watchdog, hook, diff/native, errors and
exit codes)."""
