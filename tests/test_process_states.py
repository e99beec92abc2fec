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


def test_a_start_past_its_limit_says_where_our_code_was(tmp_path):
    """The candidate's process dumps its Python stack to its log while our code starts it
    (faulthandler, server/processes.py) and cancels the dumps at stage 'load', before any
    candidate line: start_stacks reads the last dump back, bounded and printable, and nothing
    from a log without one."""
    import subprocess
    import sys

    from kernelagent.harness.server.processes import open_log, start_stacks

    log = tmp_path / "candidate.log"
    fd = open_log(log)
    try:
        assert start_stacks(fd) == ""  # empty log
        script = ("import faulthandler, sys, time\n"
                  "def creating_the_context():\n"
                  "    time.sleep(0.5)\n"
                  "faulthandler.dump_traceback_later(0.1, repeat=True, file=sys.stderr)\n"
                  "print('\\x1b[31mnoise')\n"
                  "creating_the_context()\n"
                  "faulthandler.cancel_dump_traceback_later()\n"
                  "n = open(sys.argv[1]).read().count('creating_the_context')\n"
                  "time.sleep(0.4)\n"
                  "assert open(sys.argv[1]).read().count('creating_the_context') == n  # no dump once cancelled\n")
        with open(log, "ab") as out:
            done = subprocess.run([sys.executable, "-c", script, str(log)], stdout=out, stderr=out, timeout=60)
        assert done.returncode == 0, log.read_text()
        stack = start_stacks(fd)
        assert "creating_the_context" in stack and "\x1b" not in stack and len(stack) <= 3000 and stack.startswith("Timeout (")
        assert start_stacks(None) == ""
    finally:
        import os

        os.close(fd)

