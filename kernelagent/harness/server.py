"""The harness server: a pre-imported process that forks one pair of processes per job.

Started by `Evaluator` as `python -m kernelagent.harness.server`, with a scrubbed
environment (no secrets), pinned to one device. It imports torch and Triton once and never
initialises CUDA itself, so forking a fresh child per evaluation costs milliseconds rather
than seconds of imports. For each job it forks the trusted reference process and the
candidate's process (workers.py), enforces each stage's hard timeout by killing the
candidate's whole process group, and turns whatever happens (a crash, a hang, os._exit, a
CUDA fault) into a verdict. It then goes on to the next job.

Messages from the caller are pickled (the caller is trusted); everything from the job's
processes is JSON.
"""

from __future__ import annotations

import argparse
import ast
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
import traceback
import uuid
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from kernelagent.harness import channel, defences, workers
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.inputs import SEED_ALT, SEED_EXTRA, SEED_POST_TIMING
from kernelagent.harness.result import Status

FORK = mp.get_context("fork")
LOG_TAIL_BYTES = 6000


def probe_device(requested: str) -> dict[str, Any]:
    """Runs in a throwaway child: what device is there? (keeps CUDA out of the server)."""
    import platform

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "platform": platform.platform(),
        "cuda": False,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional for the reference side
        info["triton"] = None
    if requested != "cpu" and torch.cuda.is_available():
        index = torch.device(requested).index or 0 if requested.startswith("cuda") else 0
        from kernelagent import hardware

        info.update(cuda=True, device=f"cuda:{index}", **hardware.torch_device_facts(index))
        try:
            import subprocess

            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None
        except Exception:  # noqa: BLE001
            info["driver"] = None
    else:
        info["device"] = "cpu"
    return info


def _probe_in_child(requested: str) -> dict[str, Any]:
    parent_end, child_end = FORK.Pipe()

    def target() -> None:
        try:
            child_end.send(probe_device(requested))
        except BaseException as exc:  # noqa: BLE001
            child_end.send({"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()})
        os._exit(0)

    proc = FORK.Process(target=target)
    proc.start()
    info = parent_end.recv() if parent_end.poll(120) else {"error": "device probe timed out"}
    proc.join(5)
    return info


def _static_flags(problem_source: str) -> dict[str, bool]:
    tree = ast.parse(problem_source)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return {"has_smoke": "get_smoke_inputs" in names}


def _kill_group(proc: mp.Process | None) -> None:
    if proc is None or proc.pid is None:
        return
    for sig_target in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
        try:
            sig_target()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        detail = {"SIGSEGV": " (segmentation fault)", "SIGABRT": " (abort)", "SIGKILL": " (killed)",
                  "SIGBUS": " (bus error)", "SIGFPE": " (arithmetic error)"}.get(name, "")
        return f"was killed by {name}{detail}"
    return f"exited with code {code} (os._exit / sys.exit in candidate code?)"


def _pending(conn: Connection, timeout: float):
    """The messages `conn` still holds (waiting up to `timeout` for each), until it is
    empty, closed, or sends something that is not a message of ours."""
    while conn.poll(timeout):
        try:
            message, _ = channel.recv(conn)
        except (EOFError, OSError, ValueError):
            return
        yield message


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
        return ("... [earlier output cut] ...\n" if size > LOG_TAIL_BYTES else "") + text
    except OSError:
        return ""


class Job:
    """Runs one evaluation and produces the fields of an EvalResult (as a dict)."""

    def __init__(self, request: dict[str, Any], scratch_root: Path, fingerprint: dict[str, Any]):
        self.request = request
        self.config = EvalConfig.from_dict(request["config"])
        self.fingerprint = fingerprint
        self.root = scratch_root / f"job-{uuid.uuid4().hex[:12]}"
        self.result: dict[str, Any] = {"status": None, "reason": "", "compiled": False, "correct": False,
                                       "stage": None, "trials": [], "timings": {}, "flags": [],
                                       "stage_seconds": {}, "kernels": []}
        self.checks: dict[str, dict[str, Any]] = {}
        self.planned: list[str] = []

    # -- helpers -------------------------------------------------------------------
    def fail(self, status: str, reason: str, stage: str | None) -> None:
        if self.result["status"] is None:
            self.result.update(status=status, reason=reason, stage=stage)

    def flag(self, kind: str, message: str, severity: str) -> None:
        self.result["flags"].append({"kind": kind, "message": message, "severity": severity})

    # -- the run ---------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        scratch = self.root / "candidate"
        refdir = self.root / "reference"
        scratch.mkdir(parents=True)
        refdir.mkdir(parents=True)
        (scratch / "problem.py").write_text(self.request["problem_source"])
        (scratch / "candidate.py").write_text(self.request["candidate_source"])
        (refdir / "problem.py").write_text(self.request["problem_source"])
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(refdir / "inductor")
        smoke = not self.fingerprint.get("cuda") and self.config.smoke_inputs_on_cpu and \
            _static_flags(self.request["problem_source"])["has_smoke"]
        job = {"config": self.request["config"], "device": "cuda:0" if self.fingerprint.get("cuda") else "cpu",
               "smoke": smoke, "ipc": self.request.get("ipc", True),
               "problem_source": self.request["problem_source"],
               "cuda_cache_dir": self.request.get("cuda_cache_dir"),
               "candidate_sha256": self.request.get("candidate_sha256", ""),
               "capability": self.fingerprint.get("capability")}
        if self.config.backend == "cuda" and not self.fingerprint.get("cuda"):
            return self.precompile_only(scratch, started)
        self.result["input_set"] = "smoke" if smoke else "main"
        self.result["device"] = self.fingerprint.get("gpu_name", "cpu") if self.fingerprint.get("cuda") else "cpu"

        server_ref, ref_server = FORK.Pipe()
        server_cand, cand_server = FORK.Pipe()
        cand_ref, ref_cand = FORK.Pipe()
        self.ref = FORK.Process(target=workers.reference_main, name="kernelagent-reference",
                                args=(job, ref_server, ref_cand, refdir,
                                      [server_ref, server_cand, cand_server, cand_ref]))
        self.cand = FORK.Process(target=workers.candidate_main, name="kernelagent-candidate",
                                 args=(job, cand_server, cand_ref, scratch,
                                       [server_ref, server_cand, ref_server, ref_cand]))
        self.ref.start()
        self.cand.start()
        for conn in (ref_server, ref_cand, cand_server, cand_ref):
            conn.close()
        try:
            self.supervise(server_ref, server_cand)
        except Exception:  # noqa: BLE001 - a bug of ours must not take the server down
            self.fail(Status.HARNESS_ERROR, "harness error:\n" + traceback.format_exc(limit=4), None)
        finally:
            _kill_group(self.cand)
            _kill_group(self.ref)
            self.cand.join(5)
            self.ref.join(5)
            server_ref.close()
            server_cand.close()
        self.result["log"] = _tail(scratch / "candidate.log")
        if self.config.backend == "cuda" and self.request.get("cuda_cache_dir"):
            try:  # the candidate's process group is dead: nothing of it can race this copy
                from kernelagent.harness import cuda_build

                cuda_build.publish(scratch, self.request["cuda_cache_dir"], self.request.get("candidate_sha256", ""))
            except Exception:  # noqa: BLE001 - the cache is an optimisation
                traceback.print_exc()
        ref_log = _tail(refdir / "reference.log")
        if self.result["status"] in (Status.BAD_PROBLEM, Status.HARNESS_ERROR) and ref_log.strip():
            self.result["log"] += "\n--- reference process ---\n" + ref_log
        self.result["stage_seconds"]["total_server"] = time.monotonic() - started
        shutil.rmtree(self.root, ignore_errors=True)
        return self.result

    def precompile_only(self, scratch: Path, started: float) -> dict[str, Any]:
        """A CUDA candidate without a GPU: compile its sources with nvcc (cuda_build.precompile);
        nothing runs. Compiled is all that can be said here."""
        from kernelagent.harness import cuda_build

        result = cuda_build.precompile(self.request["candidate_source"], scratch / "precompile",
                                       timeout=self.config.timeouts.cuda_build)
        self.result["stage_seconds"]["nvcc"] = result.seconds
        if result.ok:
            self.result.update(status=Status.COMPILED, compiled=True, stage="compile",
                               reason="the CUDA sources compiled with nvcc (compile-only: this machine has no GPU, "
                                      "so the extension was not linked or run; correctness and timing need a GPU)")
        elif result.skipped:
            self.result.update(status=Status.HARNESS_ERROR, stage="compile",
                               reason="cannot check this CUDA candidate without a GPU: " + result.skipped)
        else:
            self.result.update(status=Status.COMPILE_ERROR, stage="compile", reason=result.message)
        self.result["log"] = "\n".join(result.commands)[-LOG_TAIL_BYTES:]
        self.result["stage_seconds"]["total_server"] = time.monotonic() - started
        shutil.rmtree(self.root, ignore_errors=True)
        return self.result

    def supervise(self, to_ref: Connection, to_cand: Connection) -> None:
        timeouts = self.config.timeouts
        stage = "start"
        stage_started = time.monotonic()
        deadline = stage_started + timeouts.start
        ref_ready = cand_compiled = cand_done = False
        plan_sent = False
        ref_alive = cand_alive = True

        def enter(name: str) -> None:
            nonlocal stage, stage_started, deadline
            now = time.monotonic()
            self.result["stage_seconds"][stage] = self.result["stage_seconds"].get(stage, 0.0) + now - stage_started
            limit = timeouts.limit(name, self.config.backend)
            stage, stage_started, deadline = name, now, now + limit

        while not cand_done:
            conns: list[Any] = []
            if ref_alive:
                conns += [to_ref, self.ref.sentinel]
            if cand_alive:
                conns += [to_cand, self.cand.sentinel]
            ready = wait(conns, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self.fail(Status.TIMEOUT, f"stage '{stage}' ran past its {deadline - stage_started:.0f} s limit; "
                                          "the candidate's process group was killed", stage)
                return
            if to_ref in ready:
                try:
                    message, _ = channel.recv(to_ref)
                except (EOFError, OSError):
                    ref_alive = False
                    message = None
                if message:
                    kind = message.get("event")
                    if kind == "ready":
                        ref_ready = True
                        self.ready = message
                        self.result["workload"] = {
                            "input_bytes": message.get("input_bytes"), "output_bytes": message.get("output_bytes"),
                            "param_bytes": message.get("param_bytes"), "flops": message.get("flops"),
                            "dtype": message.get("output_dtype")}
                    elif kind == "check":
                        self.record_check(message)
                    elif kind == "error":
                        if message.get("kind") == "bad_problem":
                            self.fail(Status.BAD_PROBLEM, "the problem file failed to run:\n" + message["message"],
                                      "start")
                        else:
                            self.fail(Status.HARNESS_ERROR, message.get("message", ""), stage)
                        return
            if to_cand in ready:
                try:
                    message, _ = channel.recv(to_cand)
                except (EOFError, OSError, ValueError):
                    cand_alive = False
                    message = None
                if message:
                    kind = message.get("event")
                    if kind == "stage":
                        enter(str(message.get("stage")))
                    elif kind == "compiled":
                        cand_compiled = True
                        self.result["compiled"] = True
                    elif kind == "timing":
                        self.result["timings"]["candidate"] = message["timing"]
                        if message.get("escaped"):
                            self.flag("timer-escape",
                                      f"about {message.get('escaped_ms', 0):.3f} ms per call ran outside the "
                                      "timed stream (side streams, threads or deferred work); it was counted"
                                      + ("; finish all work on the current stream before returning"
                                         if self.config.defences else ""),
                                      defences.SEVERITY["timer-escape"] if self.config.defences else "info")
                        if self.config.defences:
                            self.check_roofline(message["timing"])
                    elif kind == "kernels":
                        self.result["kernels"] = message.get("kernels", [])
                    elif kind == "error":
                        self.candidate_error(message)
                        cand_done = True
                    elif kind == "done":
                        for f in message.get("flags", []):
                            self.flag(str(f.get("kind")), str(f.get("message")), str(f.get("severity", "info")))
                        cand_done = True
            if ref_ready and cand_compiled and not plan_sent and not self.config.compile_only:
                channel.send(to_cand, self.plan())
                plan_sent = True
            if self.ref.sentinel in ready and not self.ref.is_alive() and not cand_done:
                # Drain what it said before it went.
                for message in (_pending(to_ref, 0) if ref_alive else ()):
                    if message.get("event") == "check":
                        self.record_check(message)
                    elif message.get("event") == "error" and message.get("kind") == "bad_problem":
                        self.fail(Status.BAD_PROBLEM, "the problem file failed to run:\n" + message["message"],
                                  "start")
                        return
                self.fail(Status.HARNESS_ERROR, f"the reference process {_describe_exit(self.ref.exitcode)} "
                                                f"during stage '{stage}'", stage)
                return
            if self.cand.sentinel in ready and not cand_done:
                self.cand.join(1)
                if not self.cand.is_alive():
                    for message in _pending(to_cand, 0):  # anything it managed to say
                        if message.get("event") == "error":
                            self.candidate_error(message)
                    self.fail(Status.CRASHED, f"the candidate's process {_describe_exit(self.cand.exitcode)} "
                                              f"during stage '{stage}'", stage)
                    cand_done = True
        enter("finished")
        # Verdicts the reference process sent before the candidate's last message.
        for message in _pending(to_ref, 0.2):
            if message.get("event") == "check":
                self.record_check(message)
        self.conclude()
        if self.result["status"] == Status.CORRECT and self.request.get("want_baselines"):
            # Nothing of the candidate may still run (or write caches) while baselines are timed.
            _kill_group(self.cand)
            self.cand.join(5)
            self.run_baselines(to_ref)
        try:
            channel.send(to_ref, {"op": "exit"})
        except (OSError, BrokenPipeError):
            pass

    def check_roofline(self, timing: dict[str, Any]) -> None:
        """Class 16: a time below what the hardware allows for the bytes and FLOPs involved."""
        floor_ms, how = defences.roofline_floor(self.fingerprint, getattr(self, "ready", {}))
        if floor_ms is None:
            self.flag("roofline", f"impossible-speed check skipped: {how}", "info")
            return
        median = float(timing.get("median_ms", 0.0))
        if median < self.config.roofline_margin * floor_ms:
            self.flag("impossible-speed",
                      f"median {median:.4f} ms is below the roofline floor of {floor_ms:.4f} ms ({how}) on "
                      f"{self.fingerprint.get('gpu_name', 'this GPU')}: the timing cannot be real (clock patched, "
                      "work skipped or hidden); not counted as a speedup", defences.SEVERITY["impossible-speed"])

    def plan(self) -> dict[str, Any]:
        seed = self.config.seed
        checks = [{"name": f"trial {i}", "kind": "main", "seed": seed + i} for i in range(self.config.trials)]
        if self.ready.get("alt"):
            checks.append({"name": "signed-normal inputs", "kind": "alt", "seed": seed + SEED_ALT})
        for j in range(int(self.ready.get("n_extra", 0))):
            checks.append({"name": f"extra input set {j}", "kind": f"extra:{j}", "seed": seed + SEED_EXTRA + j,
                           "stop_on_failure": False})
        post = None
        if self.config.timing and self.config.post_timing_check:
            post = {"name": "post-timing check", "kind": "main", "seed": seed + SEED_POST_TIMING}
        timed = None
        if self.config.timing and self.config.defences:
            timed = {"name": "timed-output check", "kind": "main", "seed": 0}
        self.planned = [c["name"] for c in checks] + ([timed["name"]] if timed else []) + \
            ([post["name"]] if post else [])
        return {"checks": checks, "timing": self.config.timing, "post_check": post, "timed_check": timed,
                "l2_bytes": self.fingerprint.get("l2_bytes"),
                "reference_ops": self.ready.get("reference_ops", []) if self.config.defences else []}

    def record_check(self, message: dict[str, Any]) -> None:
        self.checks[message["name"]] = message
        if message["name"] == "timed-output check" and message.get("passed"):
            return  # listed among the trials only when it fails (the trial list stays stable)
        self.result["trials"].append({
            "name": message["name"], "seed": message["seed"], "passed": bool(message.get("passed")),
            "max_abs_err": message.get("max_abs_err"), "max_rel_err": message.get("max_rel_err"),
            "rel_l2_err": message.get("rel_l2_err"),
            "message": message.get("message", "") if not message.get("passed") or message.get("skipped") else "",
        })

    def candidate_error(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        stage = message.get("stage")
        text = message.get("message", "")
        for f in message.get("flags", []) or []:
            self.flag(str(f.get("kind")), str(f.get("message")), str(f.get("severity", "info")))
        if kind == "compile_error":
            self.fail(Status.COMPILE_ERROR, text, stage)
        elif kind == "rejected":
            flag_kind = ("output-alias" if "shares memory" in text else
                         "output-type" if "output" in text else "rejected")
            self.flag(flag_kind, text, "reject")
            self.fail(Status.REJECTED, f"[{flag_kind}] {text}", stage)
        elif kind == "out_of_memory":
            self.fail(Status.RUNTIME_ERROR, "out of memory on the device: " + text, stage)
        elif kind == "cuda_fault":
            self.fail(Status.RUNTIME_ERROR, "CUDA fault (illegal memory access or device assert): " + text, stage)
        else:
            self.fail(Status.RUNTIME_ERROR, text, stage)

    def conclude(self) -> None:
        self._conclude()
        # Explicit evidence of an exploit outranks the comparison's verdict.
        rejects = [f for f in self.result["flags"] if f["severity"] == "reject"]
        if rejects and self.result["status"] in (Status.CORRECT, Status.INCORRECT, Status.RUNTIME_ERROR,
                                                 Status.COMPILE_ERROR, Status.CRASHED, None):
            first = rejects[0]
            also = ""
            if self.result["status"] != Status.CORRECT and self.result.get("reason"):
                also = f" (it was also {self.result['status']}: {self.result['reason'].splitlines()[0][:300]})"
            self.result.update(status=Status.REJECTED, correct=False,
                               reason=f"[{first['kind']}] {first['message']}{also}",
                               stage=self.result.get("stage") or "evidence")

    def _conclude(self) -> None:
        if self.result["status"] is not None:
            self.result["correct"] = False
            return
        if self.config.compile_only:
            if self.result["compiled"]:
                self.result.update(status=Status.COMPILED, reason="loaded and ran its first call")
            else:
                self.fail(Status.HARNESS_ERROR, "the candidate stopped without reporting", None)
            return
        main_failures = []
        extra_failures = []
        for name in self.planned:
            check = self.checks.get(name)
            if check is None:
                main_failures.append({"name": name, "message": "this check never ran"})
            elif not check.get("passed"):
                (extra_failures if str(check.get("kind", "")).startswith("extra:") else main_failures).append(check)
        rejected = [c for c in main_failures if c.get("rejected")]
        harness = [c for c in main_failures if c.get("harness_error")]
        if harness:
            self.fail(Status.HARNESS_ERROR, harness[0]["message"], "correctness")
        elif rejected:
            self.flag(rejected[0]["rejected"], rejected[0]["message"], "reject")
            self.fail(Status.REJECTED, f"[{rejected[0]['rejected']}] {rejected[0]['name']}: {rejected[0]['message']}",
                      "correctness")
        elif main_failures:
            first = main_failures[0]
            stage = "post-check" if first["name"] in ("post-timing check", "timed-output check") else "correctness"
            hint = (" (it passed before timing: are outputs cached between calls?)"
                    if stage == "post-check" else "")
            ran = [c for c in main_failures if "kind" in c]
            if ran and ran[0].get("kind") == "alt":
                first = ran[0]
                hint = (" (it passes on the problem's own inputs but not on signed normal ones: does the kernel "
                        "rely on the input distribution?)")
                self.flag("input-distribution", f"{first['name']}: {first.get('message', '')}"[:600] + hint,
                          "info")
            self.fail(Status.INCORRECT, f"{first['name']}: {first['message']}{hint}", stage)
        else:
            self.result.update(status=Status.CORRECT, correct=True, reason="")
            if extra_failures:
                names = ", ".join(c["name"] for c in extra_failures)
                self.flag("shape-specialisation",
                          f"passes the main shape but fails {names}: {extra_failures[0]['message']}", "review")

    def run_baselines(self, to_ref: Connection) -> None:
        modes = list(self.config.compile_modes) if (self.fingerprint.get("cuda") or
                                                    self.config.compile_baseline_on_cpu) else []
        started = time.monotonic()
        # A fresh inductor cache that did not exist while the candidate ran.
        inductor_dir = self.root / f"baseline-inductor-{uuid.uuid4().hex[:8]}"
        channel.send(to_ref, {"op": "baselines", "compile_modes": modes,
                              "l2_bytes": self.fingerprint.get("l2_bytes"), "inductor_dir": str(inductor_dir)})
        remaining = self.config.timeouts.baselines
        ready = wait([to_ref, self.ref.sentinel], timeout=remaining)
        if to_ref in ready:
            try:
                message, _ = channel.recv(to_ref)
                self.result["baselines"] = message
            except (EOFError, OSError):
                self.result["baselines"] = {"errors": {"reference": "the reference process died timing baselines"}}
        elif not ready:
            self.result["baselines"] = {"errors": {"timeout": f"baselines ran past {remaining:.0f} s"}}
        else:
            self.result["baselines"] = {"errors": {"reference": f"the reference process "
                                                                f"{_describe_exit(self.ref.exitcode)}"}}
        self.result["stage_seconds"]["baselines"] = time.monotonic() - started
        if not modes and not self.fingerprint.get("cuda"):
            self.result["baselines"].setdefault("skipped", {})["compile"] = \
                "torch.compile baseline skipped on the CPU (pass compile_baseline_on_cpu to force)"


def serve(conn: Connection, requested_device: str, scratch_root: Path) -> None:
    fingerprint = _probe_in_child(requested_device)
    if not fingerprint.get("cuda"):
        # No GPU: Triton kernels run under the interpreter, on CPU tensors.
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401 - pre-import once, so each fork starts warm
    except ImportError:
        pass
    try:
        # Imported lazily by torch otherwise, at which point it rebinds torch.manual_seed and
        # friends inside the candidate's process (the tampering check would see it).
        import torch._dynamo  # noqa: F401
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    conn.send({"event": "ready", "fingerprint": fingerprint, "pid": os.getpid()})
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        op = request.get("op")
        if op == "shutdown":
            return
        if op == "evaluate":
            try:
                result = Job(request, scratch_root, fingerprint).run()
            except Exception:  # noqa: BLE001
                result = {"status": Status.HARNESS_ERROR, "reason": "harness error:\n" + traceback.format_exc()}
            conn.send({"event": "result", "id": request.get("id"), "result": result})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="kernelagent harness server (started by Evaluator)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--scratch-root", required=True)
    args = parser.parse_args(argv)
    # No PR_SET_PDEATHSIG here: it fires when the *thread* that started us exits, which
    # kills servers started from short-lived worker threads. We exit when the caller's
    # socket closes (recv raises EOFError), and jobs are bounded by their stage timeouts.
    conn = Connection(args.fd)
    serve(conn, args.device, Path(args.scratch_root))
    sys.exit(0)


if __name__ == "__main__":
    main()
