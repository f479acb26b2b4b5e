"""What each command does beside `run`: `diff` (diff.py), `run --native`
(native.py), `compile` (compile.py), and a further TPU generation's run
(retrace.py). `run` is run/runner.py's."""
