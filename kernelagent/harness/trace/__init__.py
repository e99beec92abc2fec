"""The kernel trace (issue 55): a CUPTI injection library (tracer.c, built on first use by
build.py) records every kernel, copy and set of the candidate's and the reference's processes
into a pipe the server opened before they started; marks.py puts our marker kernels around each
call; the server decodes and judges the records. Layout and record format: TRACE_SPEC /
docs/concepts/trace.md."""
