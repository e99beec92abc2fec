"""The reference process (trusted): loads the problem, builds `Model`, computes reference
outputs and compares what the candidate's process sent (relayed by the server); it also times
the loop overhead for the server's clock check, and the baselines.

Candidate code never runs here, and the reference's outputs never leave this process. Its only
channel is to the server; every message on it carries the job id and a nonce the server drew
after the candidate's process was forked.
"""

from __future__ import annotations

import math
import os
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

import torch

from kernelagent.harness import protocol
from kernelagent.harness.loop_order import LoopOrder
from kernelagent.harness.child import compare, idle_probe, inputs as inputs_mod, precise, timing, transfer
from kernelagent.harness.child.common import (AllocPressure, child_setup, compact_traceback, error_kind_of,
                                               import_problem, job_device, make_timer, make_timing_sets, op_names,
                                               parameter_bytes, sync_device)
from kernelagent.harness.child.compile_workers import set_compile_workers
from kernelagent.harness.config import EvalConfig, baseline_name
from kernelagent.harness.trace import channel as trace_channel, marks as trace_marks

_ASKS = frozenset({"check", "calibrate", "baselines", "idle_probe", "exit"})


class ReferenceSide:
    def __init__(self, job: dict[str, Any], server: Connection, workdir: Path, nonce: str):
        self.job = job
        self.job_id = job["job_id"]
        self.nonce = nonce
        self.config = EvalConfig.from_dict(job["config"])
        self.server = server
        self.workdir = workdir
        self.device = job_device(job)
        trace_channel.forget_env()  # CUDA has started (the tracer, if any, is in): none for its children
        self.marks = trace_marks.attach()  # the baselines' timed calls between markers (issue 58)
        self.bandwidth = idle_probe.Bandwidth(self.device)  # its buffer is made at the first probe
        self.pressure = AllocPressure(self.device)
        self.smoke = job["smoke"]

    def send(self, msg_type: str, /, **fields: Any) -> None:
        protocol.send(self.server, msg_type, self.job_id, self.nonce, **fields)

    def fits(self) -> bool:
        """The memory plan's estimate (child/memory_plan.py), before anything is allocated."""
        if self.device.type != "cuda" or not self.job.get("device_free_bytes"):
            return True
        from kernelagent.harness.child import memory_plan

        sizes = memory_plan.estimate(self.job["problem_source"])
        reason = memory_plan.too_large_reason(sizes, int(self.job["device_free_bytes"])) if sizes else None
        if reason:
            self.send("ref_error", kind="too_large", message=reason)
            return False
        return True

    def setup(self) -> bool:
        try:
            self.problem = import_problem(self.job, self.workdir)
            init = inputs_mod.init_inputs(self.problem, self.smoke, self.device, self.config.weight_seed)
            self.model = inputs_mod.build_model(self.problem.Model, init, self.device, self.config.weight_seed)
            first = inputs_mod.make_inputs(self.problem, "main", int(self.job["compile_seed"]), self.smoke,
                                           self.device)
            with torch.no_grad():
                # No copies of the inputs here (the memory plan: a 16 GiB input set is held once);
                # values a model mutates in place do not matter for what `first` is used for below
                # (shapes, the op names, a rough time).
                outputs = transfer.flatten_outputs(self.model(*first))
            reference_ops = op_names(self.model, first) if self.config.defences else []
            n_extra = inputs_mod.count_extra_sets(self.problem, self.device) if self.config.extra_inputs else 0
            if self.smoke and hasattr(self.problem, "get_smoke_init_inputs"):
                n_extra = 0  # extra sets fit get_init_inputs(), not the smoke constructor arguments
            flops = None
            if hasattr(self.problem, "get_flops"):
                flops = float(self.problem.get_flops(*first))
            # A rough per-call time of the reference, from which the server sizes the timed loop.
            sync_device(self.device)
            started = time.perf_counter()
            with torch.no_grad():
                for _ in range(2):
                    self.model(*first)
            sync_device(self.device)
            estimate_ms = (time.perf_counter() - started) * 1e3 / 2
        except BaseException as exc:  # a broken problem is the user's error: say where
            if error_kind_of(exc, "") == "out_of_memory":  # the machine's limit, not a broken problem
                free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else 0
                self.send("ref_error", kind="too_large",
                          message=f"the reference ran out of device memory building the problem's model, inputs "
                                  f"and outputs ({free / 2**30:.1f} GiB free now): run it on a larger GPU or make "
                                  "its inputs smaller (this is not the candidate's failure)")
                return False
            self.send("ref_error", kind="bad_problem", message=compact_traceback(exc, "problem.py"))
            return False
        self.atol = self.config.atol if self.config.atol is not None else getattr(self.problem, "ATOL", None)
        self.rtol = self.config.rtol if self.config.rtol is not None else getattr(self.problem, "RTOL", None)
        self.output_shapes = [(tuple(o.shape), o.dtype) for o in outputs]
        input_bytes, output_bytes = int(inputs_mod.tensor_bytes(first)), int(inputs_mod.tensor_bytes(outputs))
        output_dtype = str(outputs[0].dtype).removeprefix("torch.") if outputs else "float32"
        self.io_bytes = input_bytes + output_bytes
        self.high = precise.HighPrecision(self.model, self.device, estimate_ms)
        del first, outputs  # before the derived sets run: never both sets in memory at once
        try:
            extra_plan, extra_skipped = self.validate_derived(int(n_extra))
        except BaseException as exc:  # out of memory: the harness's own run, never the candidate's
            self.send("ref_error", kind="harness", message="validating the derived input sets failed in the "
                      "reference process: " + compact_traceback(exc, "problem.py"))
            return False
        self.release()
        memory: dict[str, Any] = {}
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            memory = {"free_bytes": int(free), "total_bytes": int(total)}
        self.send("ref_ready", n_extra=int(n_extra), extra_plan=extra_plan, extra_skipped=extra_skipped,
                  alt=bool(self.config.alt_distribution and getattr(self.problem, "ALT_DISTRIBUTION", True)),
                  input_bytes=input_bytes, output_bytes=output_bytes, output_dtype=output_dtype,
                  flops=flops if flops is None or math.isfinite(flops) else None,
                  near_one=bool(self.config.near_one_inputs and NEAR_ONE_OPS & set(reference_ops)),
                  param_bytes=int(parameter_bytes(self.model)), reference_ops=list(reference_ops),
                  estimate_ms=float(estimate_ms), memory=memory, extra_bytes=dict(getattr(self, "extra_bytes", {})))
        return True

    def validate_derived(self, n_extra: int) -> tuple[list[int], dict[str, str]]:
        # (also records each derived set's input and output bytes in self.extra_bytes: the server
        # bounds what it reads of the candidate's outputs for that set by them)
        """Which extra sets to check. The problem's own get_extra_inputs(): all of them. Derived
        sets (harness/derive/): the reference runs each once, in order, before the candidate
        sees any, and the first `derived_checks` that run with non-empty, finite outputs are
        checked; the others are skipped with the reason (a derived size the model cannot take,
        such as a pooling window larger than the input, is not a check on the candidate)."""
        self.extra_bytes: dict[str, int] = {}
        if not n_extra or not hasattr(self.problem, inputs_mod.DERIVED_ATTR) \
                or hasattr(self.problem, "get_extra_inputs"):
            return list(range(n_extra)), {}
        plan: list[int] = []
        skipped: dict[str, str] = {}
        for j in range(n_extra):
            if len(plan) >= self.config.derived_checks:
                break
            kind = f"extra:{j}"
            try:
                values = inputs_mod.make_inputs(self.problem, kind, inputs_mod.SEED_EXTRA + j, self.smoke,
                                                self.device)
                with torch.no_grad():
                    outputs = transfer.flatten_outputs(self.model(*values))
                sync_device(self.device)
                self.extra_bytes[kind] = int(inputs_mod.tensor_bytes(values)) + int(inputs_mod.tensor_bytes(outputs))
                if not outputs or any(o.numel() == 0 for o in outputs):
                    skipped[kind] = "the reference's output is empty at these sizes"
                elif not all(bool(torch.isfinite(o).all()) for o in outputs if o.is_floating_point()):
                    skipped[kind] = "the reference's outputs are not finite at these sizes"
                else:
                    plan.append(j)
                del values, outputs
            except torch.OutOfMemoryError:
                # A derived set (the grown one above all) the device cannot hold beside the main
                # set's: not a check on the candidate; a spare takes its place.
                values = outputs = None
                self.release()
                skipped[kind] = "the reference runs out of device memory at these sizes"
            except Exception as exc:  # noqa: BLE001 - the reference cannot run this set: not a check
                skipped[kind] = "the reference itself fails at these sizes: " + \
                    compact_traceback(exc, "problem.py", limit=2).splitlines()[-1][:400]
        return plan, skipped

    def release(self) -> None:
        """Return this process's cached device memory to the driver. The reference and the
        candidate share one device, and PyTorch's caching allocator keeps what a stage freed:
        without this, the candidate of a 16 GiB problem ran out of memory beside a reference
        that held 36 GB it no longer used."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def serve(self) -> None:
        while True:
            try:
                message = protocol.recv(self.server, _ASKS, self.job_id, self.nonce)
            except (EOFError, OSError):
                return
            kind = message["type"]
            if kind == "check":
                n_payloads = sum(1 for r in message["outputs"] + message["inputs"]
                                 if isinstance(r, dict) and r.get("kind") == "bytes")
                payloads = [protocol.recv_payload(self.server) for _ in range(n_payloads)]
                self.check(message, payloads)
                if not message["keep_cache"]:
                    self.release()
            elif kind == "calibrate":
                self.calibrate(message)
            elif kind == "idle_probe":
                self.idle_probe()
            elif kind == "baselines":
                self.baselines(message)
                self.release()
            elif kind == "exit":
                memory = {}
                if self.device.type == "cuda":
                    memory = {"peak_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                              "alloc_retries": int(self.pressure.retries)}  # while baselines were timed
                self.send("ref_stats", memory=memory)
                return

    def check(self, message: dict[str, Any], payloads: list[bytes]) -> None:
        name, kind, seed = message["name"], message["kind"], int(message["seed"])
        n_outputs = int(message["n_outputs"])
        verdict: dict[str, Any] = {"name": name, "kind": kind, "seed": seed, "passed": False, "message": "",
                                   "max_abs_err": None, "max_rel_err": None, "rel_l2_err": None,
                                   "rejected": None, "harness_error": False, "skipped": False, "precision": ""}
        received = None
        extra = kind.startswith("extra:")
        candidate_error = message.get("candidate_error")
        try:
            reference = None
            try:
                # The reference runs on the inputs it made (no copy: one input set in memory); the
                # candidate's inputs after its call are compared with these after the reference's.
                after_reference = self.check_inputs(kind, seed)
                # float64 copies for the float64 run (child/precise.py), taken before the reference
                # runs: a model may write its inputs
                wide_inputs = self.high.copies(after_reference)
                with torch.no_grad():
                    reference = transfer.flatten_outputs(self.model(*after_reference))
                sync_device(self.device)
            except Exception as exc:
                if not extra or isinstance(exc, torch.OutOfMemoryError):
                    raise
                # An extra set (derived ones above all) that the reference itself cannot run is
                # not a valid check: skipped, never the candidate's failure.
                verdict.update(passed=True, skipped=True,
                               message="skipped: the reference itself fails on this input set: "
                                       + compact_traceback(exc, "problem.py", limit=2).splitlines()[-1][:400])
            if reference is None:
                pass
            elif kind == "alt" and not all(bool(torch.isfinite(r).all()) for r in reference if r.is_floating_point()):
                verdict.update(passed=True, skipped=True,
                               message="skipped: the reference is not finite on signed normal inputs")
            elif kind == "near-one" and not all(bool(torch.isfinite(r).all()) for r in reference
                                                if r.is_floating_point()):
                verdict.update(passed=True, skipped=True,
                               message="skipped: the reference is not finite on inputs near one")
            elif extra and not all(bool(torch.isfinite(r).all()) for r in reference if r.is_floating_point()):
                verdict.update(passed=True, skipped=True,
                               message="skipped: the reference's outputs are not finite on this input set")
            elif extra and candidate_error is not None:
                verdict.update(passed=False, message=str(candidate_error))
            else:
                if len(message["outputs"]) != n_outputs:
                    raise transfer.TransferError("the output count does not match the description")
                oversized = _beyond(message["outputs"], reference) or _beyond(
                    message["inputs"], [t for t in after_reference if isinstance(t, torch.Tensor)])
                if oversized:  # not read at all: the problem's own sizes bound what is taken in
                    verdict.update(passed=False, message=oversized)
                else:
                    high = self.high.run(wide_inputs, reference, regenerate=lambda: self.check_inputs(kind, seed))
                    wide_inputs = None
                    try:
                        received = transfer.receive(message["outputs"] + message["inputs"], payloads, self.device)
                        tensors = received.tensors
                        mutation = compare.compare_inputs(after_reference, tensors[n_outputs:]) \
                            if message["inputs"] else None
                        result = None if mutation else \
                            compare.compare_outputs(reference, tensors[:n_outputs], self.atol, self.rtol, high)
                    except (torch.OutOfMemoryError, transfer.TransferError):
                        raise
                    except Exception as exc:  # the candidate's tensors are what the reference cannot take
                        raise transfer.TransferError("the reference could not take the candidate's tensors: "
                                                     + (str(exc).splitlines() or [type(exc).__name__])[0][:300])
                    if mutation:
                        verdict.update(passed=False, rejected="input-mutation", message=mutation)
                    else:
                        verdict.update(passed=bool(result.passed), message=result.message,
                                       max_abs_err=_finite(result.max_abs_err),
                                       max_rel_err=_finite(result.max_rel_err), rel_l2_err=_finite(result.rel_l2_err),
                                       precision=str(result.precision)[:600])
            if reference is not None:
                del reference, after_reference
            high = wide_inputs = None
        except (transfer.TransferError, KeyError, TypeError) as exc:
            verdict.update(passed=False, rejected="bad-payload",
                           message=f"the candidate's process sent a malformed result: {exc}")
        except torch.OutOfMemoryError as exc:
            verdict.update(passed=False, harness_error=True,
                           message=f"the reference process ran out of device memory checking: {str(exc)[:300]}")
        except BaseException as exc:  # our comparison failing is never the candidate's fault
            verdict.update(passed=False, message="the reference check failed: " + compact_traceback(exc),
                           harness_error=True)
        finally:
            if received is not None:
                received.close()
        verdict["message"] = str(verdict["message"])[:4000]
        self.send("verdict", **verdict)

    def join_compiling(self) -> None:
        """Nothing of the early baseline compile may run beside a timed phase."""
        if getattr(self, "_compiling", None) is not None:
            self._compiling.join()

    def check_inputs(self, kind: str, seed: int) -> list[Any]:
        """A check's inputs, made from the global generators once the early baseline compile is
        done: that thread seeds them too (its own first call's inputs), and Dynamo restores the
        RNG state it saved when its tracing ends, so inputs made beside it can differ from the
        candidate's and an honest kernel read as `input-mutation` (docs/concepts/concurrency.md,
        "Host work overlaps"). The candidate's import and compile still
        overlap the baseline compile; its checks wait for it."""
        self.join_compiling()
        return inputs_mod.make_inputs(self.problem, kind, seed, self.smoke, self.device)

    def calibrate(self, order: dict[str, Any]) -> None:
        """The candidate's timed loop with an empty model, in the same two phases: fresh input
        sets, L2 flush, synchronisation and the output copy, so the server can subtract what the
        loop itself costs from its clock around the candidate's measured phase. Out of device
        memory (a second calibration runs beside the candidate's kept outputs), it answers
        `calibrated` with seconds -1 and stays alive: the server then keeps its first measure."""
        self.join_compiling()
        try:
            self._calibrate(order)
            return
        except torch.OutOfMemoryError:
            pass
        self.release()  # here, once the traceback (and the loop's tensors it holds) is gone
        self.send("calibrated", seconds=-1.0, calls=0, payload_bytes=[])

    def _calibrate(self, message: dict[str, Any]) -> None:
        order = LoopOrder.from_message(message)
        calls, warmup, keep, budget = order.calls, order.warmup_calls, order.keep, order.budget_bytes
        dummy = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in self.output_shapes]
        after_call = timing.KeptOutputs(self.output_shapes, keep, calls, self.device)

        def empty_model(*inputs: Any) -> Any:
            return dummy

        timer = make_timer(self.device, self.config, order.l2_bytes)
        loop = timing.FixedLoop(timer)
        timer.raise_clocks()  # unclocked, before the warm-up: see timing.Timer.raise_clocks
        loop.run(empty_model, inputs_mod.FreshInputs(self.problem, int(message["seed"]), self.smoke, self.device,
                                                     budget_bytes=budget), 0, warmup)
        sync_device(self.device)
        self.send("warmed", kept=[])
        segments = order.segments
        for segment in range(segments):  # the candidate's loop runs in these segments too
            go = protocol.recv(self.server, {"go"}, self.job_id, self.nonce)
            started = time.perf_counter()
            sets = inputs_mod.FreshInputs(self.problem, int(go["seed"]), self.smoke, self.device,
                                          budget_bytes=budget)
            loop.run(empty_model, sets, 0, calls, after_call)
            sync_device(self.device)
            seconds = time.perf_counter() - started
            del sets
            # Where the candidate's kept outputs come to the server as bytes, these come too: the
            # server's clock around a segment runs until they are there, on both loops.
            described = [transfer.describe(slot, False) for slot in after_call.slots] \
                if order.payloads else []
            try:
                self.send("calibrated", seconds=seconds, calls=calls,
                          payload_bytes=[len(memoryview(p).cast("B")) for d in described for p in d.payloads])
                for d in described:
                    for data in d.payloads:
                        protocol.send_payload(self.server, data)
            finally:
                for d in described:
                    transfer.release(d)
            if segment == segments - 1:
                # The candidate's loop comes next, on the same device: hand the memory back first.
                del after_call, dummy
                self.release()

    def idle_probe(self) -> None:
        """Is the device idle, and its memory bandwidth quiet? (child/idle_probe.py)"""
        self.join_compiling()
        typical = idle_probe.spin_us(self.device)
        self.send("idle", us=typical, idle=typical <= idle_probe.IDLE_MAX_US, copy_us=self.bandwidth.read_us())

    def start_compiling(self) -> None:
        """When the server will want the torch.compile baselines (job["baselines_compile"]: a
        cache miss on a GPU), compile them now, in a thread, while the candidate's process
        imports, compiles and is checked: Inductor's seconds leave the evaluation's critical
        path. Only for problems small beside the device's memory (the compile runs one call)."""
        plan = self.job.get("baselines_compile")
        self._compiled: dict[str, Any] | None = None
        self._compiling = None
        if not plan or self.device.type != "cuda":
            return
        free = torch.cuda.mem_get_info(self.device)[0]
        if 3 * self.io_bytes > 0.2 * free:  # a large problem: compile later, alone in memory
            return
        import threading

        def work() -> None:
            try:
                self._compiled = self.compile_runners(list(plan["compile_modes"]), plan.get("inductor_dir"),
                                                      plan.get("triton_dir"), int(self.job["compile_seed"]))
            except BaseException as exc:  # noqa: BLE001 - baselines() compiles again and reports
                self._compiled = {"error": compact_traceback(exc)}

        self._compiling = threading.Thread(target=work, name="kernelagent-baseline-compile", daemon=True)
        self._compiling.start()

    def compile_runners(self, modes: list[str], inductor_dir: str | None, triton_dir: str | None,
                        seed: int) -> dict[str, Any]:
        """Each runner with its "empty" twin (a one-op module on a 1-element tensor, run the same
        way: eager, or compiled in the same mode; its time is the runner's own per-call cost:
        Python, guards, launch, CUDA-graph replay), each called once so that compilation is done
        before anything is timed. {"runners": {name: (runner, empty)}, "errors": {name: text}}."""
        if inductor_dir:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
        if triton_dir:  # Inductor's kernels land in Triton's cache, not its own
            os.environ["TRITON_CACHE_DIR"] = str(triton_dir)
        set_compile_workers()
        errors: dict[str, str] = {}
        empty = _EmptyModel().to(self.device)
        runners: dict[str, Any] = {"eager": (self.model, empty)}
        for mode in modes:
            name = baseline_name(mode)
            try:
                options = {"mode": None if mode == "default" else mode}
                runners[name] = (torch.compile(self.model, **options), torch.compile(empty, **options))
            except BaseException as exc:
                errors[name] = compact_traceback(exc)
        first = inputs_mod.make_inputs(self.problem, "main", seed, self.smoke, self.device)
        one = [torch.zeros(1, device=self.device)]
        for name, (runner, empty_runner) in list(runners.items()):
            if name == "eager":
                continue
            try:
                with torch.no_grad():
                    runner(*first)  # compiles the graph, untimed
                    empty_runner(*one)
            except BaseException as exc:
                errors[name] = compact_traceback(exc)
                runners.pop(name)
        del first
        sync_device(self.device)
        return {"runners": runners, "errors": errors, "modes": list(modes)}

    def wait_for_go(self) -> None:
        """The server's `go` for the baselines' timing; meanwhile it holds the device's timing
        slot and asks whether the device is idle (answered here)."""
        while protocol.recv(self.server, {"go", "idle_probe"}, self.job_id, self.nonce)["type"] == "idle_probe":
            self.idle_probe()

    def baselines(self, message: dict[str, Any]) -> None:
        """Compile (or take what start_compiling compiled), say `warmed`, wait for the server's
        `go` (it holds the device's timing slot then), and time every runner."""
        timings: dict[str, Any] = {}
        errors: dict[str, str] = {}
        overhead: dict[str, float | None] = {}
        warmed = False
        try:
            compiled = None
            if getattr(self, "_compiling", None) is not None:
                self._compiling.join()
                compiled = self._compiled
                if compiled is not None and ("error" in compiled or
                                             compiled.get("modes") != list(message.get("compile_modes", []))):
                    compiled = None  # compiled for other modes, or failed: do it here
            if compiled is None:
                compiled = self.compile_runners(list(message.get("compile_modes", [])), message.get("inductor_dir"),
                                                message.get("triton_dir"), int(message["seed"]))
            runners, errors = compiled["runners"], dict(compiled["errors"])
            input_sets = make_timing_sets(self.problem, int(message["seed"]), self.config, self.smoke, self.device,
                                          budget_bytes=int(message["budget_bytes"]))
            timer = make_timer(self.device, self.config, message.get("l2_bytes"))
            empty_inputs = [[torch.zeros(1, device=self.device)]]
            sync_device(self.device)
            self.send("warmed", kept=[])
            warmed = True
            self.wait_for_go()
            for name, (runner, empty_runner) in runners.items():
                try:
                    phase = trace_marks.baseline_phase(name, list(message.get("compile_modes", [])))
                    report = self._time_runner(timer, runner, input_sets, timing.phase_marker(self.marks, phase))
                    timings[name] = {**report.timing.__dict__, "samples_ms": [float(x) for x in report.samples_ms]}
                    if self.device.type == "cuda" and not torch.backends.cuda.matmul.allow_tf32 \
                            and not torch.backends.cudnn.allow_tf32:
                        timings[name]["note"] = (timings[name]["note"] + "; " if timings[name]["note"] else "") \
                            + "TF32 off (full fp32 matmuls and convolutions)"
                except BaseException as exc:
                    errors[name] = compact_traceback(exc)
                    continue
                try:
                    overhead[name] = float(self._time_runner(timer, empty_runner, empty_inputs,
                                                             empty=True).timing.median_ms)
                except BaseException as exc:  # the baseline's own time stands without it
                    overhead[name] = None
                    errors[f"{name} (empty call)"] = compact_traceback(exc)
        except (EOFError, OSError, protocol.ProtocolError):
            raise
        except BaseException as exc:
            errors["setup"] = compact_traceback(exc)
        if not warmed:
            self.send("warmed", kept=[])
            self.wait_for_go()
        self.marks.flush(mark=trace_marks.BASELINE_FLUSH, final=False)  # the markers' records, then the server's
        self.send("baseline_timings", timings=timings, errors=errors, overhead_ms=protocol.json_safe(overhead))

    def _time_runner(self, timer: timing.Timer, runner: Any, input_sets: list[list[Any]],
                     mark: Callable[[int], Callable[[bool], Any]] | None = None,
                     empty: bool = False) -> timing.TimingReport:
        with torch.no_grad():
            runner(*input_sets[0])  # compiles torch.compile's graph, untimed
        sync_device(self.device)
        cfg = self.config
        target, most = cfg.target_ms, cfg.max_reps
        if empty:  # an empty runner: fewer calls (EMPTY_TARGET_MS)
            target, most = min(EMPTY_TARGET_MS, target), max(min(EMPTY_MAX_REPS, most), cfg.min_reps)
        with self.pressure.counting():
            return timer.measure(runner, input_sets, cfg.warmup_ms, target, cfg.min_reps, most,
                                 budget_s=cfg.timeouts.timing, mark=mark)


# An empty runner's call (its per-call cost, beside the baseline's) is timed this long, at most this
# often: at the loop's target and cap, under the launch cover, two took ~0.9 s of a cold eval's wait.
EMPTY_TARGET_MS = 40.0
EMPTY_MAX_REPS = 200


class _EmptyModel(torch.nn.Module):
    """The least a call can do: one elementwise op on a 1-element tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _beyond(records: Any, expected: Any) -> str:
    """Why the candidate's described tensors are not read: more of them, or one with more
    elements, than the reference's own (outputs, or inputs after the call). "" when in bounds."""
    if not isinstance(records, list):
        raise transfer.TransferError("malformed tensor list")
    if not records:
        return ""
    if len(records) > len(expected):
        return f"{len(records)} tensors described where the reference has {len(expected)}"
    for index, (record, want) in enumerate(zip(records, expected)):
        shape = record.get("shape") if isinstance(record, dict) else None
        if not isinstance(shape, list) or len(shape) > 64 or \
                not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 40 for s in shape):
            raise transfer.TransferError("bad shape in a tensor description")
        numel = math.prod(shape)
        if not isinstance(want, torch.Tensor):
            continue
        if numel > want.numel():
            return (f"output {index} has shape {tuple(shape)} ({numel:,} elements) where the reference's has "
                    f"shape {tuple(want.shape)} ({want.numel():,}); not read")
    return ""


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# The reference's ops whose outputs decay or grow along a dimension (products and scans): such a
# problem also gets a check with lines of inputs near one mixed in (child/special.py), along which
# every output element stays significant.
NEAR_ONE_OPS = frozenset({"cumprod", "prod", "cumsum", "logcumsumexp", "cummax", "cummin", "pow"})


def reference_main(job: dict[str, Any], server: Connection, workdir: Path,
                   keep_fds: tuple[int, ...] | list[int] = ()) -> None:
    """Entry point of the reference process (forked by the server)."""
    child_setup(workdir / "reference.log", workdir, [server.fileno(), *keep_fds])
    try:
        hello = protocol.recv(server, {"ref_nonce"}, job["job_id"])
        if hello["derived"]:  # the derived sets, drawn by the server after the fork (server/draws.py)
            from kernelagent.harness import derive

            job = dict(job, derived_sources=[derive.apply(job["problem_source"], v) for v in hello["derived"]])
        side = ReferenceSide(job, server, workdir, hello["nonce"])
        if side.fits() and side.setup():
            side.start_compiling()
            side.serve()
    except (EOFError, OSError, protocol.ProtocolError):
        pass
    import sys

    sys.stdout.flush()
    os._exit(0)
