"""`python -m kernelagent.harness.server`: see main.py."""

import os
import sys

# The CPU affinity comes first, before main.py imports torch: threads torch starts at import
# would keep the whole machine's CPUs otherwise (an affinity is per thread, inherited).
if "--cpus" in sys.argv[:-1]:
    spec = sys.argv[sys.argv.index("--cpus") + 1]
    try:
        os.sched_setaffinity(0, {int(c) for c in spec.split(",")})
    except (OSError, ValueError):
        pass  # main() tries again and says why on stderr

from kernelagent.harness.server.main import main  # noqa: E402

main()
