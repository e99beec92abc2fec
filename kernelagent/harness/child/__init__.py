"""The job's processes, forked from the server: the reference (trusted) and the candidate's
(hostile). See kernelagent/harness/__init__.py."""
