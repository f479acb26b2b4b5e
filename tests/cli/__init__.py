"""Tests of the command line (cli.py, runner, outfile, watchdog, hook, diff/native, errors and
exit codes)."""
