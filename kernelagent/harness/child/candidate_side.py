"""The candidate's process (untrusted): imports the candidate, builds `ModelNew`, runs it on
inputs made from the seeds the server hands out, and sends its outputs to the reference process
for comparison. It also runs the in-process timing loop.

Everything this process says is a claim. The evidence gathered here (defences.Monitor, the
in-process timer) is honest feedback for honest kernels; no verdict rests on it alone: the
comparison happens in the reference process and the time is checked against the server's clock.
"""

from __future__ import annotations

import os
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from kernelagent.harness import protocol
from kernelagent.harness.child import cuda_evidence, defences, inputs as inputs_mod, timing, transfer
from kernelagent.harness.child.kernel_profile import profile_kernels
from kernelagent.harness.child.common import (AllocPressure, aliasing, compact_traceback, error_kind_of, import_problem,
                                               job_device, make_timer, sync_device, tensor_inputs)
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.loop_order import LoopOrder
from kernelagent.harness.trace import marks as trace_marks

NUMERIC_MODES = {
    "torch.backends.cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
    "torch.backends.cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    "torch.backends.cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
    "torch.backends.cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
    "torch.get_default_dtype()": torch.get_default_dtype,
}


def _numeric_modes() -> dict[str, str]:
    out = {}
    for name, read in NUMERIC_MODES.items():
        try:
            out[name] = str(read())
        except Exception as exc:  # noqa: BLE001 - report, never fail on a probe
            out[name] = f"<unreadable: {exc}>"
    return out


class CandidateFailure(Exception):
    def __init__(self, kind: str, stage: str, message: str):
        super().__init__(message)
        self.kind, self.stage, self.message = kind, stage, message



# What the server may ask of this process once its first call has run.
_ASKS = frozenset({"plan", "run_check", "time", "finish"})


class CandidateSide:
    """Runs the candidate as the server directs, one message at a time."""

    def __init__(self, job: dict[str, Any], server: Connection, workdir: Path):
        self.job = job
        self.job_id = job["job_id"]
        self.config = EvalConfig.from_dict(job["config"])
        self.server = server
        self.workdir = workdir
        self.smoke = job["smoke"]
        self.current = "start"
        self.flags: list[dict[str, Any]] = []
        self.monitor: defences.Monitor | None = None
        self.modes_before: dict[str, str] | None = None
        self.device_share: dict[str, Any] | None = None
        self.poison_bytes = 0
        self.builder: Any = None  # child/cuda_build.BuildHook for backend "cuda"
        self.output_shapes: list[tuple[tuple[int, ...], torch.dtype]] = []
        # The kernel trace's markers around each call (issue 55): no-ops until attached, and
        # where no tracer was injected (the CPU).
        self.marks = trace_marks.Marks(reason="not attached yet")
        self.checks_run = 0

    # -- the channel -------------------------------------------------------------------
    def send(self, msg_type: str, /, **fields: Any) -> None:
        protocol.send(self.server, msg_type, self.job_id, None, **fields)

    def stage(self, name: str) -> None:
        self.current = name
        self.send("stage", stage=name)

    # -- the run -----------------------------------------------------------------------
    def run(self) -> None:
        self.stage("start")
        self.device = job_device(self.job)
        self.pressure = AllocPressure(self.device)
        if self.device.type == "cuda":
            torch.empty(1, device=self.device)  # create the context now, not inside "load"
        self.marks = trace_marks.attach()  # CUDA has started: the driver loaded the tracer, if any
        self.problem = import_problem(self.job, self.workdir)
        # The candidate gets no handle on the problem module through sys.modules.
        sys.modules.pop("kernelagent_problem", None)
        self.threads_before = {t.ident for t in threading.enumerate()}
        self.modes_before = _numeric_modes()
        if self.config.backend == "cuda":
            from kernelagent.harness.child import cuda_build

            capability = self.job.get("capability") or ""
            if capability:  # build for this GPU only (faster, and part of the cache key)
                os.environ["TORCH_CUDA_ARCH_LIST"] = capability
            # The job's own copy of its cache entries, staged and hash-checked by the server.
            self.builder = cuda_build.BuildHook(self.workdir, self.workdir / ".ka-build-cache",
                                                self.job.get("candidate_sha256") or "unknown", capability)
            self.builder.install()  # before the audit hook: importing cpp_extension may probe for nvcc
        if self.config.defences:
            from kernelagent.harness.child import common, compare, inputs, persisting_l2, sm_clocks, timing

            watched = {"kernelagent.harness.child.timing": timing,
                       "kernelagent.harness.child.timing.Timer": timing.Timer,
                       "kernelagent.harness.child.timing.FixedLoop": timing.FixedLoop,
                       "kernelagent.harness.child.persisting_l2": persisting_l2,
                       "kernelagent.harness.child.persisting_l2.PersistingL2": persisting_l2.PersistingL2,
                       "kernelagent.harness.child.sm_clocks": sm_clocks,
                       "kernelagent.harness.child.compare": compare,
                       "kernelagent.harness.child.transfer": transfer,
                       "kernelagent.harness.child.inputs": inputs,
                       "kernelagent.harness.child.common": common,
                       "kernelagent.harness.protocol": protocol,
                       "kernelagent.harness.child.candidate_side": sys.modules[__name__],
                       "kernelagent.harness.child.candidate_side.CandidateSide": CandidateSide}
            self.monitor = defences.Monitor(self.workdir / "candidate.py", self.workdir, self.config,
                                            builder=self.builder, watched=watched)
            self.monitor.install()

        # Our start is over: no stack dumps (server/processes.py) once candidate code may run.
        import faulthandler

        faulthandler.cancel_dump_traceback_later()
        self.stage("load")
        try:
            module = inputs_mod.import_file(self.workdir / "candidate.py", "candidate")
        except BaseException as exc:
            if self.builder is not None and self.builder.last_error:
                raise CandidateFailure("compile_error", "load", self.builder.last_error)
            raise CandidateFailure("compile_error", "load",
                                   "importing the candidate raised:\n" + compact_traceback(exc, "candidate.py"))
        model_cls = getattr(module, "ModelNew", None)
        if not isinstance(model_cls, type):
            raise CandidateFailure("compile_error", "load", "the candidate defines no class ModelNew")
        try:
            init = inputs_mod.init_inputs(self.problem, self.smoke, self.device, self.config.weight_seed)
            self.model = inputs_mod.build_model(model_cls, init, self.device, self.config.weight_seed)
        except BaseException as exc:
            if self.builder is not None and self.builder.last_error:
                raise CandidateFailure("compile_error", "load", self.builder.last_error)
            raise CandidateFailure("compile_error", "load",
                                   "ModelNew(*get_init_inputs()) raised:\n" + compact_traceback(exc, "candidate.py"))
        if self.monitor is not None:
            self.monitor.check_tampering("after import")

        self.stage("compile")
        first = inputs_mod.make_inputs(self.problem, "main", int(self.job["compile_seed"]), self.smoke, self.device)
        try:
            with torch.no_grad(), self._watch("first call", first):
                self.mark(trace_marks.FIRST, 0, False)
                out = self.model(*first)
                sync_device(self.device)
                self.mark(trace_marks.FIRST, 0, True)
        except BaseException as exc:
            if self.builder is not None and self.builder.last_error:
                raise CandidateFailure("compile_error", "compile", self.builder.last_error)
            raise CandidateFailure(error_kind_of(exc, "compile_error"), "compile",
                                   "the first forward call raised:\n" + compact_traceback(exc, "candidate.py"))
        try:
            outputs = transfer.flatten_outputs(out)
        except transfer.OutputTypeError as exc:
            raise CandidateFailure("rejected", "compile", str(exc))
        self.output_shapes = [(tuple(o.shape), o.dtype) for o in outputs]
        # Poison as much freed memory as one input set and its outputs occupied (where the next
        # outputs will be allocated), within the memory plan.
        self.poison_bytes = inputs_mod.tensor_bytes(outputs) + inputs_mod.tensor_bytes(first) + (64 << 20)
        del out, first, outputs
        self.send("compiled")
        if self.config.compile_only:
            self.finish({"profile": False, "device_share": False})
            return
        while True:
            message = protocol.recv(self.server, _ASKS, self.job_id)
            kind = message["type"]
            if kind == "plan":
                if self.monitor is not None:
                    self.monitor.set_reference_ops([str(op) for op in message["reference_ops"]])
                self.stage("correctness")
            elif kind == "run_check":
                if message["name"].startswith("post-timing"):
                    self.stage("post-check")
                self.check(message)
                if self.device.type == "cuda":
                    # The harness's inputs and the outputs of this check are freed: give the cached
                    # blocks back, so the reference (same device) can use them in its next stage.
                    torch.cuda.empty_cache()
            elif kind == "time":
                self.time(message)
            elif kind == "finish":
                self.finish(message)
                return

    def own_kernel_names(self) -> set[str]:
        """Names of the candidate's own kernels: its Triton kernels that ran, and the
        __global__ functions of its CUDA extensions."""
        names: set[str] = set()
        if self.monitor is not None:
            names |= self.monitor.state.own_names
        if self.builder is not None:
            names |= self.builder.own_names
        return names

    def mark(self, phase: int, index: int, end: bool) -> None:
        """One of the kernel trace's markers on the current stream (trace/marks.py)."""
        if self.marks.available:
            self.marks.mark(stream=timing._current_stream_handle(), phase=phase, index=index, end=end)

    def _watch(self, name: str, values: Any = ()) -> Any:
        if self.monitor is None:
            from contextlib import nullcontext

            return nullcontext()
        return self.monitor.watch(name, values)

    # -- correctness -------------------------------------------------------------------
    def check(self, check: dict[str, Any]) -> None:
        kind, seed = check["kind"], int(check["seed"])
        try:
            # The harness's own allocations, apart from the candidate's call: said apart in the
            # reason, but this process is the candidate's, so the server never takes it for a
            # fault of the harness (server/failures.py: its runtime error).
            if check["overrides"] is not None and kind.startswith("extra:"):  # a derived set, drawn in secret
                from kernelagent.harness import derive

                inputs_mod.add_derived_set(self.problem, int(kind.split(":", 1)[1]),
                                           derive.apply(self.job["problem_source"], check["overrides"]),
                                           self.workdir / "problem.py")
            values = inputs_mod.make_inputs(self.problem, kind, seed, self.smoke, self.device)
            if self.monitor is not None and self.device.type == "cuda":
                cuda_evidence.poison_cuda_memory(self.device, self.poison_bytes)
        except BaseException as exc:
            kind_ = error_kind_of(exc, "runtime_error")
            raise CandidateFailure("harness_out_of_memory" if kind_ == "out_of_memory" else kind_, self.current,
                                   f"making the inputs of {check['name']} raised:\n" + compact_traceback(exc))
        try:
            with torch.no_grad(), self._watch(check["name"], values):
                self.mark(trace_marks.CHECK, self.checks_run, False)
                try:
                    out = self.model(*values)
                    sync_device(self.device)
                finally:  # a check that raised (an extra set the reference may skip) still ends
                    self.mark(trace_marks.CHECK, self.checks_run, True)
                    self.checks_run += 1
        except Exception as exc:
            error_kind = error_kind_of(exc, "runtime_error")
            if not (kind.startswith("extra:") and error_kind == "runtime_error"):
                raise CandidateFailure(error_kind, self.current,
                                       f"{check['name']} raised:\n" + compact_traceback(exc, "candidate.py"))
            # An ordinary exception on an extra (other-shape) input set: not a crash, a failed
            # check. The reference decides: a set it cannot run itself is skipped.
            self.send("outputs", name=check["name"], n_outputs=0, outputs=[], inputs=[],
                      error=f"{check['name']} raised:\n" + compact_traceback(exc, "candidate.py")[:3900])
            protocol.recv(self.server, {"check_reply"}, self.job_id)
            return
        except BaseException as exc:
            raise CandidateFailure(error_kind_of(exc, "runtime_error"), self.current,
                                   f"{check['name']} raised:\n" + compact_traceback(exc, "candidate.py"))
        try:
            outputs = transfer.flatten_outputs(out)
        except transfer.OutputTypeError as exc:
            raise CandidateFailure("rejected", self.current, f"{check['name']}: {exc}")
        aliased = aliasing(outputs, tensor_inputs(values))
        if aliased:
            raise CandidateFailure("rejected", self.current, f"{check['name']}: {aliased}")
        use_ipc = self.device.type == "cuda" and self.job.get("ipc", True)
        sent_out = transfer.describe(outputs, use_ipc)
        sent_in = transfer.describe(tensor_inputs(values), use_ipc)
        try:
            self.send("outputs", name=check["name"], n_outputs=len(outputs), outputs=sent_out.records,
                      inputs=sent_in.records, error=None)
            for data in sent_out.payloads + sent_in.payloads:
                protocol.send_payload(self.server, data)
            # The answer comes after the reference has compared (the server relays it).
            protocol.recv(self.server, {"check_reply"}, self.job_id)
        finally:
            transfer.release(sent_out)
            transfer.release(sent_in)

    # -- timing ------------------------------------------------------------------------
    def time(self, message: dict[str, Any]) -> None:
        """The timed loop, exactly as the server ordered it, in two phases: `warmup_calls` calls on
        fresh inputs from the order's seed (allocations, caches and clocks settle; not clocked by
        the server), then `segments` times: once the server answers `go` with the segment's seed,
        `calls` calls on fresh inputs from that seed, every output copied aside into the kept
        slots (outside the timed region), the report, and the server's answer once it has had the
        outputs it chose verified."""
        self.stage("timing")
        order = LoopOrder.from_message(message)
        calls, warmup, keep, budget = order.calls, order.warmup_calls, order.keep, order.budget_bytes
        try:
            kept_outputs = timing.KeptOutputs(self.output_shapes, keep, calls, self.device)
            slots = kept_outputs.slots

            def after_call(index: int, out: Any) -> None:
                kept_outputs(index, transfer.flatten_outputs(out))  # every timed output must be plain

            timer = make_timer(self.device, self.config, order.l2_bytes)
            loop = timing.FixedLoop(timer, marks=self.marks)
            warm_sets = inputs_mod.FreshInputs(self.problem, int(message["seed"]), self.smoke, self.device,
                                               budget_bytes=budget)
            timer.raise_clocks()  # unclocked, before the warm-up: see timing.Timer.raise_clocks
            loop.run(self.model, warm_sets, 0, warmup, phase=trace_marks.WARMUP)
            del warm_sets
            sync_device(self.device)
        except transfer.OutputTypeError as exc:
            raise CandidateFailure("rejected", "timing", f"a warm-up call: {exc}")
        except BaseException as exc:
            raise CandidateFailure(error_kind_of(exc, "runtime_error"), "timing",
                                   "the warm-up calls raised:\n" + compact_traceback(exc, "candidate.py"))
        # On a GPU the kept slots are described (CUDA IPC handles of their memory) now, before the
        # clock starts: the reference reads the slots in place after each segment, with this
        # process stopped.
        use_ipc = self.device.type == "cuda" and self.job.get("ipc", True)
        described = [transfer.describe(slot, True) for slot in slots] if use_ipc else []
        # The allocator's retries over every segment, read before `warmed` and after the last
        # segment's answer: never inside the server's clock on a segment (from `go` to the report),
        # which the reference's empty loop, subtracted from it, does not pay for.
        began = self.pressure.begin()
        self.send("warmed", kept=[{"index": kept_outputs.first + i, "outputs": d.records}
                                  for i, d in enumerate(described)])
        escaped: list[float] = []
        timed_so_far = 0  # the trace's markers number the timed calls across segments
        try:
            # The loop runs in the segments the server ordered (the kept slots are reused by each):
            # a segment's seed comes with its `go`, and the server answers after checking the
            # outputs it chose in secret, if any.
            for _ in range(order.segments):
                go = protocol.recv(self.server, {"go"}, self.job_id)
                try:
                    sets = inputs_mod.FreshInputs(self.problem, int(go["seed"]), self.smoke, self.device,
                                                  budget_bytes=budget)
                    report = loop.run(self.model, sets, 0, calls, after_call, phase=trace_marks.TIMED,
                                      first_index=timed_so_far)
                    timed_so_far += calls
                    sync_device(self.device)
                    del sets
                except transfer.OutputTypeError as exc:
                    raise CandidateFailure("rejected", "timing", f"a timed call: {exc}")
                except BaseException as exc:
                    raise CandidateFailure(error_kind_of(exc, "runtime_error"), "timing",
                                           "the timed calls raised:\n" + compact_traceback(exc, "candidate.py"))
                escaped.append(report.escaped_ms)
                cpu_described = [] if use_ipc else [transfer.describe(slot, False) for slot in slots]
                kept = [{"index": index, "outputs": d.records}
                        for index, d in zip(kept_outputs.index, cpu_described)]
                try:
                    self.send("timing", samples_ms=[float(x) for x in report.samples_ms],
                              event_ms=[float(timer.event_ms)], overhead_ms=float(timer.overhead_ms), calls=calls,
                              kept=kept,
                              meaningful=bool(report.timing.meaningful))
                    for d in cpu_described:
                        for data in d.payloads:
                            protocol.send_payload(self.server, data)
                    # The kept outputs stay as they are until the server has had them verified.
                    reply = protocol.recv(self.server, {"check_reply"}, self.job_id)
                finally:
                    for d in cpu_described:
                        transfer.release(d)
                if reply["stop"]:
                    break
        finally:
            for d in described:
                transfer.release(d)
            del described
        report.escaped_ms = sorted(escaped)[len(escaped) // 2] if escaped else 0.0
        self.pressure.end(began)
        if self.monitor is not None:  # evidence, outside the server's clock
            self.monitor.check_tampering("during timing")
        if timing.escaped_work_is_significant(report):
            self.flags.append({"kind": "timer-escape", "severity": "review",
                               "message": f"about {report.escaped_ms:.3f} ms per call ran outside the timed "
                                          "stream (side streams, threads or deferred work); it was counted"})

    # -- the end -----------------------------------------------------------------------
    def finish(self, order: dict[str, Any]) -> None:
        # The trace's last record, before any profiler of ours (torch.profiler takes CUPTI over).
        self.marks.flush(mark=2, final=True)
        if order.get("device_share") and self.monitor is not None and self.device.type == "cuda" \
                and self.config.min_own_device_share:
            self.stage("profile")
            values = inputs_mod.make_inputs(self.problem, "main", int(self.job["compile_seed"]) + 1, self.smoke,
                                            self.device)
            try:
                self.device_share = cuda_evidence.device_time_share(self.model, values, self.own_kernel_names(),
                                                                    self.device)
            except Exception as exc:  # noqa: BLE001 - the profiler is evidence, not a gate
                self.flags.append({"kind": "profile", "severity": "info",
                                   "message": f"the profiled call failed: {exc}"})
            del values
        if order.get("profile"):
            self.stage("profile")
            notes: list[str] = []
            try:
                with self.pressure.counting():
                    kernels = profile_kernels(self.model, self.problem, int(self.job["compile_seed"]) + 2,
                                              self.smoke, self.device, own_names=self.own_kernel_names(),
                                              raise_clocks=make_timer(self.device, self.config, None).raise_clocks,
                                              notes=notes)
            except Exception as exc:  # noqa: BLE001 - a profiler failure is not the candidate's verdict
                kernels = []
                self.flags.append({"kind": "profile", "severity": "info", "message": f"torch.profiler failed: {exc}"})
            self.flags += [{"kind": "profile", "severity": "info", "message": note} for note in notes]
            self.send("kernels", kernels=protocol.json_safe(kernels, max_str=protocol.CANDIDATE_STRING_CLIP))
        if self.monitor is None and hasattr(self, "threads_before"):
            new_threads = [t.name for t in threading.enumerate() if t.ident not in self.threads_before]
            if new_threads:
                self.flags.append({"kind": "threads", "severity": "info",
                                   "message": f"the candidate started threads: {', '.join(new_threads[:5])}"})
        self.send("done", flags=protocol.json_safe(self.final_flags(), max_str=protocol.CANDIDATE_STRING_CLIP),
                  memory=self.memory())

    def memory(self) -> dict[str, Any]:
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            # alloc_retries: the device was full while timed work ran (common.AllocPressure)
            return {"peak_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                    "alloc_retries": int(self.pressure.retries)}
        return {}

    def final_flags(self) -> list[dict[str, Any]]:
        flags = list(self.flags)
        modes_after = _numeric_modes()
        if self.monitor is not None:
            try:
                flags += self.monitor.flags(self.modes_before, modes_after, self.device_share)
            except Exception as exc:  # noqa: BLE001
                flags.append({"kind": "defences", "severity": "info", "message": f"evidence failed: {exc}"})
        elif self.modes_before is not None:
            changed = [f"{k}: {self.modes_before[k]} -> {v}" for k, v in modes_after.items()
                       if self.modes_before.get(k) != v]
            if changed:
                flags.append({"kind": "numeric-modes", "severity": "info",
                              "message": "the candidate changed global numeric modes: " + "; ".join(changed)})
        return flags


def candidate_main(job: dict[str, Any], server: Connection, workdir: Path) -> None:
    """Entry point of the candidate's process (forked by the server; jailed before this runs)."""
    side = CandidateSide(job, server, workdir)
    try:
        side.run()
    except CandidateFailure as failure:
        _report_failure(side, failure.kind, failure.stage, failure.message)
    except protocol.ProtocolError as exc:
        _report_failure(side, "protocol", side.current, f"the harness sent something unexpected: {exc}")
    except (EOFError, OSError):
        pass  # the server went away: nothing to report to
    except BaseException as exc:
        _report_failure(side, error_kind_of(exc, "runtime_error"), side.current, compact_traceback(exc, "candidate.py"))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _report_failure(side: CandidateSide, kind: str, stage: str, message: str) -> None:
    try:
        flags = side.final_flags()
    except Exception:  # noqa: BLE001
        flags = []
    try:
        side.send("failure", kind=kind, stage=stage, message=message[:20000],
                  flags=protocol.json_safe(flags, max_str=protocol.CANDIDATE_STRING_CLIP))
    except (OSError, ValueError):
        pass
