"""What the server reads of a job's processes from /proc (server/processes.py): the states it
reports when a stage runs past its limit."""

from __future__ import annotations


def test_a_stage_past_its_limit_says_what_each_process_was_doing():
    """server/processes.tree_states: pid, name, state and kernel wait of a process and its
    descendants, as a stage runs past its limit (a hang beside others showed no CPU in either of
    the job's processes and said nothing more). A stopped process reads T."""
    import os
    import signal
    import subprocess
    import time

    from kernelagent.harness.server.processes import tree_states

    child = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(100):
            lines = [line for line in tree_states(os.getpid(), limit=64) if line.startswith(f"{child.pid} ")]
            if lines and lines[0].split()[2] == "T":
                break
            time.sleep(0.01)
        assert lines and lines[0].split()[1] == "sleep" and lines[0].split()[2] == "T", lines
        assert lines[0].split()[4].startswith("ctxt=")  # its context switches, read from /proc
        assert lines[0].split()[5].startswith("cpus=") and lines[0].split()[5] != "cpus=?"  # its affinity
        # The limit holds: one line, the root's (its context switches move between two reads).
        one, whole = tree_states(os.getpid(), limit=1), tree_states(os.getpid())
        assert len(one) == 1 and len(whole) >= 2
        assert one[0].split()[0] == whole[0].split()[0] == str(os.getpid())
        assert tree_states(None) == [] and tree_states(2**22 + 12345) == []  # nothing to read
    finally:
        child.kill()
        child.wait()
