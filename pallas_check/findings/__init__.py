"""What a run found, as plain data: the kinds (kinds.py), a Finding and a
CallSummary (finding.py), the user's source frames (sourceinfo.py), quantities
as people read them (units.py), two outputs compared element-wise as `diff`
compares them (output_diff.py). Imports no engine, checker or report."""
