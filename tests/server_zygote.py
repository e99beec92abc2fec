"""One zygote per test process (kernelagent/harness/server/zygote.py): the harness servers the
tests start fork from a process that has imported torch, instead of paying `import torch` each
(1.4 CPU-s of a server's 1.9 on the 2-core CI machine; the suite starts hundreds of servers).

Started by tests/conftest.py's pytest_configure in every pytest process (each xdist worker),
named by KERNELAGENT_SERVER_ZYGOTE for the Evaluators of the tests and of the CLI commands they
run; servers under bubblewrap's prefix and warm harnesses still start their own interpreter.
Not for GPU runs (`-m gpu`: their timings stay those of a plain server). KERNELAGENT_TEST_ZYGOTE=0
turns it off, and tests/test_zygote.py checks servers from both give the same verdicts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_started: dict[str, object] = {}


def wanted(markexpr: str) -> bool:
    if os.environ.get("KERNELAGENT_TEST_ZYGOTE", "1") == "0":
        return False
    return not ("gpu" in markexpr and "not gpu" not in markexpr)


def start() -> str | None:
    """The zygote's socket, with KERNELAGENT_SERVER_ZYGOTE set to it; None where it did not start
    (the servers then start as they do for users)."""
    from kernelagent.harness import interpreter
    from kernelagent.harness.caller import zygote
    from kernelagent.harness.jail import sandbox

    folder = Path(tempfile.mkdtemp(prefix="ka-zygote-"))
    sock = folder / "zygote.sock"
    env = sandbox.server_environ()  # what its servers may see of the environment, and no more
    if not Path("/dev/nvidiactl").exists():  # no GPU here: every server runs Triton's interpreter
        env["TRITON_INTERPRET"] = "1"  # and the zygote imports Triton with it, once
    with open(folder / "zygote.log", "ab") as log:
        proc = subprocess.Popen(interpreter.module_argv("kernelagent.harness.server.zygote", "--socket", str(sock)),
                                env=env, cwd=folder, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                start_new_session=True)
    line = proc.stdout.readline() if proc.stdout else b""
    try:
        ready = json.loads(line or b"{}").get("ready") == proc.pid
    except ValueError:
        ready = False
    if not ready:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
        return None
    _started.update(proc=proc, folder=folder)
    os.environ[zygote.ENV] = str(sock)
    return str(sock)


def stop() -> None:
    proc, folder = _started.pop("proc", None), _started.pop("folder", None)
    os.environ.pop("KERNELAGENT_SERVER_ZYGOTE", None)
    if proc is not None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
