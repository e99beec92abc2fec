"""The harness server's process: trusted, never runs candidate code (see kernelagent/harness/__init__.py)."""
