"""The candidate's jail, whole: the outer bubblewrap prefix around the server (sandbox.py),
the per-job namespaces a candidate's process enters (candidate.py, namespaces.py, mounts.py,
fds.py), the probe of what isolation this machine allows (probe.py), and the jail for
programs the harness does not fork itself (exec_in.py). Below child/, server/ and caller/,
which all use it."""
