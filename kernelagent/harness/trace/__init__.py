"""The kernel trace of a job's own processes (issue 55): a CUPTI injection library (tracer.c, built
on first use by build.py) records every kernel, copy and set of the candidate's and the reference's
processes into a pipe the server opened before they started; marks.py puts our marker kernels
around each call; records.py decodes what the server read, calls.py pairs the markers into calls
and rules.py judges them (docs/concepts/defences.md)."""
