"""The kernel trace of a job's own processes (issue 55): the tracer, its channel, its records and their rules."""
