"""Jobs entering their jail while the host makes and removes top-level directories to hide,
run by tests/test_jail.py (root only: it makes directories in /). Prints JSON: how many jails
were made, and why the others failed."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelagent.harness.jail import namespaces  # noqa: E402


def main(runs: int) -> dict:
    tag = uuid.uuid4().hex[:8]
    tops = [Path(f"/ka-churn-{tag}-{i}") for i in range(4)]
    stop = threading.Event()

    def churn() -> None:  # the host: each directory made and removed again, over and over
        while not stop.is_set():
            for top in tops:
                top.mkdir(exist_ok=True)
            for top in tops:
                try:
                    top.rmdir()
                except OSError:
                    pass

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    made, failures = 0, {}
    try:
        for _ in range(runs):
            scratch = Path(tempfile.mkdtemp(prefix="ka-churn-scratch-"))
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    namespaces.enter_job_jail(scratch, list(tops), [w])
                    os._exit(0)
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    os.write(w, str(exc).encode()[:2000])
                    os._exit(70)
            os.close(w)
            with os.fdopen(r, "rb") as fh:
                message = fh.read().decode(errors="replace")
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) == 0:
                made += 1
            else:
                failures[message] = failures.get(message, 0) + 1
            os.rmdir(scratch)
    finally:
        stop.set()
        thread.join()
        for top in tops:
            try:
                top.rmdir()
            except OSError:
                pass
    return {"made": made, "failures": failures}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
