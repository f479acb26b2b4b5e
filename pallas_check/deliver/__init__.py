"""Text put where it was asked for: stdout or `--output` (delivery.py, written
safely by outfile.py), and the progress line on a terminal (progress_line.py)."""
