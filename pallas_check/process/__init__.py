"""The process a run lives in: Ctrl-C and SIGTERM (interrupts.py), the watchdog
that keeps it stoppable (watchdog.py), the processes the script starts
(children.py), the heap around a call (host_memory.py), the script run as
`__main__` in it (execfile.py: its crash is the user's)."""
