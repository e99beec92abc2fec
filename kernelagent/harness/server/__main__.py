"""The harness server's entry (interpreter.module_argv("kernelagent.harness.server", ...)): see main.py."""

import os
import sys

from kernelagent.harness import interpreter, procname

# Only this installation's code on the import path (started by interpreter.module_argv, or
# forked by the test zygote, itself started so): else one line and exit 2, before anything more.
interpreter.refuse_foreign_path("the harness server")
procname.set_name("ka-server")  # a label for ps and benchmarks/host_cpu.py

# The CPU affinity (--cpus) comes first, before main.py imports torch: threads torch starts at
# import would keep the whole machine's CPUs otherwise (an affinity is per thread, inherited).
# Several servers on one host then stop competing for the same cores while each compiles; the
# jobs inherit it (the caller also sizes OMP, MKL and Inductor's compile workers to match).
if "--cpus" in sys.argv[:-1]:
    spec = sys.argv[sys.argv.index("--cpus") + 1]
    try:
        os.sched_setaffinity(0, {int(c) for c in spec.split(",")})
    except (OSError, ValueError) as exc:
        print(f"kernelagent server: CPU affinity {spec} not applied: {exc}", file=sys.stderr)

from kernelagent.harness.server.main import main  # noqa: E402

main()
