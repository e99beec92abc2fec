"""The candidate process's Python audit hook (defences.Monitor installs it; it cannot be removed):
writes outside the scratch folder, network access and processes are refused as they happen
(`sandbox-escape`); gc and frame access and reads of the harness's or the reference's files from
candidate code are `reading-reference`; ctypes, tracing and patching of torch/triton/harness
types are `tampering`. Each finding goes to the monitor's state (`state.violations`), which the
monitor's verdict reads. See the threat table in child/defences.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable

_STDLIB_PREFIXES = tuple(p + os.sep for p in {os.path.dirname(os.__file__)} - {""})
_PACKAGE_DIR = str(Path(__file__).resolve().parents[2])


def install(state: Any, cand: str, scratch: str, protected: Iterable[str], builder: Any,
            own_files: Iterable[str] = ()) -> None:
    """Add the hook for the candidate file `cand` (its frames are the candidate's), writing only
    under `scratch`, reading none of `protected` (and the package). `builder`: a CUDA candidate's
    cuda_build.BuildHook (its builds may start compilers), or None. `own_files`: the monitor's
    modules, whose frames are bookkeeping, never the caller."""
    protected = tuple(protected) + (_PACKAGE_DIR,)
    own = frozenset(own_files) | {__file__}
    allowed_write = (scratch, "/dev/shm", "/dev/null", "/proc/self", "/dev/nvidia", "/sys/")
    getframe = sys._getframe
    stdlib = _STDLIB_PREFIXES
    busy = [False]
    blocked: list[str | None] = [None]
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    events_any = {"open", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod",
                  "os.chown", "os.symlink", "os.link", "shutil.rmtree", "os.utime"}
    events_net = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                  "socket.gethostbyname", "socket.gethostbyaddr", "urllib.Request", "http.client.connect"}
    events_proc = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "os.startfile"}
    events_read = {"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                   "sys._getframe"}
    events_tamper = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.string_at", "ctypes.cdata", "ctypes.addressof",
                     "sys.settrace", "sys.setprofile", "object.__setattr__", "object.__delattr__",
                     "sys.addaudithook", "ctypes.cdata/buffer", "ctypes.set_errno"}
    watched = events_any | events_net | events_proc | events_read | events_tamper

    def record(kind: str, text: str) -> None:
        items = state.violations.setdefault(kind, [])
        if len(items) < 20 and text not in items:
            items.append(text)
        if kind == "sandbox-escape":
            blocked[0] = text

    def caller() -> tuple[str, int, str]:
        """(file, line) of the innermost frame outside the stdlib and this module, and the
        file of the innermost frame outside this module (the audited call's direct caller)."""
        frame = getframe(2)
        if frame is not None and frame.f_code.co_filename == __file__:
            return "", 0, ""  # raised by this module's own bookkeeping
        immediate = ""
        while frame is not None:
            name = frame.f_code.co_filename
            if name != __file__ and not immediate:
                immediate = name
            if name == __file__ or name.startswith("<frozen") or (
                    name.startswith(stdlib) and "-packages" not in name):
                frame = frame.f_back
                continue
            return name, frame.f_lineno, immediate
        return "", 0, immediate

    cpp_extension = os.sep + os.path.join("torch", "utils", "cpp_extension.py")

    def hook(event: str, args: tuple) -> None:
        if event not in watched or busy[0]:
            return
        busy[0] = True
        try:
            if event in events_any:
                path = args[0] if args else None
                if isinstance(path, bytes):
                    path = path.decode(errors="replace")
                if not isinstance(path, str):
                    return
                full = os.path.abspath(path)
                writes = event != "open"
                if event == "open":
                    mode = args[1] if len(args) > 1 else None
                    flags = args[2] if len(args) > 2 else 0
                    writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                        (isinstance(flags, int) and bool(flags & write_flags))
                if writes and not full.startswith(allowed_write):
                    file, line, _ = caller()
                    record("sandbox-escape", f"wrote to {full} ({event}"
                           + (f", {Path(file).name}:{line})" if file else ")"))
                elif not writes and full.startswith(protected) and not full.startswith(scratch):
                    file, line, _ = caller()
                    if file == cand:
                        record("reading-reference", f"read {full} (candidate.py:{line})")
                return
            if event in events_net:
                file, line, _ = caller()
                record("sandbox-escape", f"network access {event}{args[1:2]!r} "
                       f"({Path(file).name}:{line})")
                return
            file, line, immediate = caller()
            if event in events_proc and file.endswith(cpp_extension):
                # torch's extension builder runs ninja, nvcc and the host compiler: allowed only
                # inside a build the harness's load_inline wrapper started (cuda_build.py), never
                # through torch's private build helpers called directly.
                if builder is None or not builder.in_build:
                    record("sandbox-escape", f"{event} from torch.utils.cpp_extension outside a "
                                             "load_inline build (a direct call of its build helpers)")
                return
            if file != cand:
                return
            where = f"candidate.py:{line}"
            if event in events_proc:
                record("sandbox-escape", f"{event} from {where}")
            elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames"):
                record("reading-reference", f"{event}() at {where}")
            elif event == "sys._getframe":
                if immediate != cand and not immediate.endswith(os.sep + "inspect.py"):
                    return  # namedtuple, typing, enum... find their caller's module this way
                record("reading-reference", f"frame inspection (sys._getframe/inspect) at {where}")
            elif event in ("object.__setattr__", "object.__delattr__"):
                target = args[0] if args else None
                module = getattr(target, "__module__", "") or ""
                if isinstance(target, type) and isinstance(module, str) and \
                        module.split(".")[0] in ("torch", "triton", "kernelagent", "time", "builtins"):
                    record("tampering", f"patched {module}.{target.__qualname__}.{args[1]} at {where}")
            else:
                record("tampering", f"{event} at {where}")
        except Exception:  # noqa: BLE001 - the hook's own errors must never reach the program
            pass
        finally:
            busy[0] = False
            if blocked[0] is not None:
                text, blocked[0] = blocked[0], None
                # Enforced, not only reported: the write, connection or process does not happen.
                raise PermissionError(f"kernelagent sandbox: {text} is not allowed")  # noqa: B012

    sys.addaudithook(hook)
