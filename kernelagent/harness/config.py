"""Settings for one evaluation, and the per-dtype tolerance table.

Everything here is plain data: it is pickled to the harness processes and hashed into
cache keys, so it must stay importable without torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field

# (atol, rtol) by the reference output's dtype. fp32 is held at 1e-4 so that a kernel
# which silently drops to TF32 or bf16 cannot pass as fp32.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}


# The environment variable through which the server (server/main.py share_compile_workers) gives
# each reference process its share of Inductor's compile workers (child/reference_side.py).
COMPILE_WORKERS_ENV = "KERNELAGENT_COMPILE_WORKERS"

# torch.compile modes the Inductor baseline can be timed in (`--inductor-modes`). "default" is
# always timed: optimize's target, bench's fast_p and verify's gate compare against it. Each mode's
# timing is reported under its own baseline name (baseline_name).
INDUCTOR_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")


def baseline_name(mode: str) -> str:
    """The result's baseline name for an Inductor mode: "compile" for default, "compile:MODE" else
    (the names the reference process times them under)."""
    return "compile" if mode == "default" else f"compile:{mode}"


@dataclass
class StageTimeouts:
    """Hard wall-clock limits, in seconds, for each stage of one evaluation."""

    start: float = 60.0  # fork the child, initialise the device, build the problem's inputs
    load: float = 60.0  # import the candidate and construct ModelNew
    compile: float = 120.0  # the first forward call (JIT compilation happens here)
    correctness: float = 120.0  # all correctness trials
    timing: float = 120.0  # the candidate's timing loop
    baselines: float = 600.0  # eager + torch.compile baselines (compilation included)
    # backend "cuda": the load and compile stages get at least this long (nvcc builds the
    # candidate's extension there), and so does the compile-only nvcc check without a GPU.
    cuda_build: float = 300.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _require_number(f"timeouts.{f.name}", getattr(self, f.name), minimum=0, strict=True)

    def scaled(self, scale: float = 1.0, **stages: float) -> "StageTimeouts":
        """A copy with every limit times `scale`, then the named stages set to the given seconds
        (not scaled). ValueError for an unknown stage or a limit that is not finite and > 0."""
        _require_number("timeout scale", scale, minimum=0, strict=True)
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(stages) - set(names))
        if unknown:
            raise ValueError(f"unknown stage {unknown[0]!r} (stages: {', '.join(names)})")
        values = {name: getattr(self, name) * scale for name in names}
        values.update(stages)
        return StageTimeouts(**values)

    def limit(self, stage: str, backend: str = "triton") -> float:
        """The hard limit of `stage` for an evaluation with this backend."""
        value = {"start": self.start, "load": self.load, "compile": self.compile,
                 "correctness": self.correctness, "post-check": self.correctness, "timing": self.timing,
                 "profile": self.timing, "baselines": self.baselines,
                 # the kernel evidence's ncu run (a fresh process that imports torch; its kernels
                 # come from its own Triton cache): one session per device, so a long one delays others
                 "evidence": self.correctness}.get(stage, self.correctness)
        if backend == "cuda" and stage in ("load", "compile"):
            value = max(value, self.cuda_build)
        return value


@dataclass
class EvalConfig:
    """What one evaluation does. Defaults are the documented, trusted settings."""

    trials: int = 5
    # None (the default): the server draws a secret base seed per evaluation with os.urandom, after
    # the candidate's process exists, and reveals each check's seed only when that check runs; the
    # result reports them afterwards. An int fixes them (for debugging: then they are predictable).
    seed: int | None = None
    weight_seed: int = 0
    atol: float | None = None  # None: the problem's ATOL, else the dtype table
    rtol: float | None = None
    # Stages to run. compile_only stops after the first forward call.
    compile_only: bool = False
    timing: bool = True
    baselines: bool = True
    # torch.compile baseline modes (INDUCTOR_MODES): "default" always; the others on request
    # (`--inductor-modes`), each reported under baseline_name(mode).
    compile_modes: tuple[str, ...] = ("default",)
    # On the CPU, torch.compile needs a C++ toolchain and minutes per problem, and the
    # numbers mean nothing there; skip it unless asked.
    compile_baseline_on_cpu: bool = False
    # Timing: warm up for at least this long, then measure for about target_ms.
    warmup_ms: float = 25.0
    target_ms: float = 200.0
    min_reps: int = 5
    max_reps: int = 1000
    rotating_input_sets: int = 4  # fresh input sets cycled through the timed iterations
    flush_l2: bool = True
    # A GPU spin of this many microseconds is queued before each timed call, so the host's
    # launch of the call (Python, Triton's launcher, guards) overlaps it and the events time the
    # device's work, as a profiler does (docs/concepts/timing.md, "Launch latency"). Launch time
    # beyond the spin still counts. 0: the call's launch latency is inside every sample.
    # The price, for trust: the spin runs in the candidate's process, and the server subtracts
    # it with the rest of the loop's own cost (its calibration), so a candidate that skips it
    # and forges its clocks is credited up to this much per call; Nsight Compute's sum of its
    # kernels bounds such a claim (server/kernel_evidence.py, SLOWER_FACTOR). 400 us because a
    # shorter cover let the launch of a slow-to-launch kernel outrun the spin (docs/concepts/
    # timing.md, "The last miss, `27_batchnorm_eval`, was the launch cover"). A segment's first
    # call gets more (child/timing.FIRST_COVER_FACTOR).
    launch_cover_us: float = 400.0
    # Re-check correctness on fresh inputs after the timing loop (defeats output caching).
    post_timing_check: bool = True
    # Also check on signed normal inputs (defeats kernels that exploit rand()'s [0, 1)).
    alt_distribution: bool = True
    # Also check on inputs near one where the reference runs products or scans (cumprod, prod,
    # cumsum...): there every output element stays significant, so a kernel that ignores part of
    # its output fails (a cumprod of rand() decays below the tolerance within a few dozen steps).
    near_one_inputs: bool = True
    # Use the problem's get_extra_inputs() as generalisation checks.
    extra_inputs: bool = True
    # A problem without get_extra_inputs() (KernelBench): this many extra input sets derived from
    # its size constants (harness/derive/: smaller, odd sizes; pinned constants kept), each
    # validated on the reference when it runs. A candidate correct on the main shape but wrong
    # on one is flagged shape-specialisation (review). 0 turns derivation off; needs extra_inputs.
    derived_checks: int = 2
    # CPU mode: prefer the problem's get_smoke_inputs() (small sizes for the interpreter).
    smoke_inputs_on_cpu: bool = True
    use_baseline_cache: bool = True
    # Also run the candidate under torch.profiler and report its top kernels.
    profile: bool = False
    # After a CUDA result that would count as a win (correct, nothing flagged), run the candidate
    # once more under Nsight Compute, jailed, and check the kernels ncu saw against its source and
    # its timing (server/kernel_evidence.py): evidence from outside the candidate's process, which
    # the candidate cannot switch off. On by default; where it cannot be collected the result is
    # flagged for review and does not count as a win. Costs one ncu run per win; nothing on CPU.
    kernel_evidence: bool = True
    # Where that evidence comes from (issue 55): "trace" (a CUPTI trace of the job's own
    # processes, harness/trace/, judged by the server; Nsight Compute runs as an audit where the
    # caller asks for one, on a seeded share `audit_share` of the rest, and wherever the tracer
    # cannot load or its trace is incomplete) or "ncu" (Nsight Compute on every such result, the
    # trace judged beside it where the tracer runs).
    evidence: str = "trace"
    audit_share: float = 0.1
    # This evaluation's result is audited by Nsight Compute whatever the share draws: `verify`
    # and `regenerate` (every lock), optimize's final kernel where its last evaluation was not.
    audit: bool = False
    # Every result that beats Inductor is audited too: set where a person is shown the result as
    # a win (`kernelagent eval`, bench's candidates, MCP's `evaluate`, the agent's `submit` and
    # final verification). By the server where it knows the Inductor time (cached or its own),
    # else by the caller after its merge (a second evaluation with `audit`). Off by default: an
    # agent's other turns, RL rewards and the library's own evaluations are judged by their trace
    # and audited on the seeded share, as issue 55 designs (auditing every win of a batch costs
    # the timing slot too much: docs/concepts/concurrency.md, "The tracer's cost and throughput
    # with the audits").
    audit_wins: bool = False
    # False: this job's processes run without the kernel tracer, so its evidence is Nsight
    # Compute's, as where no tracer loads (never none). For measuring what the tracer costs the
    # timings, traced and untraced jobs of the same candidate alternating in one server
    # (benchmarks/trace_cost.py); the loop's calibration and the baselines' cache key on it.
    trace: bool = True
    # Reward-hacking defences (see kernelagent/harness/child/defences.py for each class and its
    # verdict). False turns off the run-time evidence, the static pass, fresh inputs per timed
    # iteration, the timed-output check, memory poisoning and the roofline check: the harness
    # then behaves as before the defences (for overhead comparisons, never for real runs).
    defences: bool = True
    # The static pass (static_check.py): "reject" (findings of reject severity end the
    # evaluation before any process starts), "warn" (reported as info flags) or "off".
    static_check: str = "reject"
    # Who did the work: "reject" (a candidate whose heavy work ran in PyTorch is rejected,
    # no-custom-kernel) or "allow" (the same findings reported at info). "allow" is for a whole
    # model's end-to-end check (kernelagent/wholemodel): PyTorch runs every region not replaced,
    # and each replaced region's kernel was judged with "reject" on its own region problem.
    torch_work: str = "reject"
    # Heavy PyTorch ops (GEMM, conv, softmax, norms, reductions, activations... and the
    # reference's own non-glue ops) on at least this many elements mean torch did the work.
    heavy_op_min_elements: int = 4096
    # On CUDA, the candidate's own kernels must hold at least this share of device time in
    # one profiled call (None: skip the profiled call).
    min_own_device_share: float | None = 0.5
    # A candidate median below this fraction of the roofline floor is flagged for review.
    roofline_margin: float = 0.9
    # "triton": kernels are @triton.jit functions. "cuda": kernels are CUDA C++ built with
    # torch.utils.cpp_extension.load_inline (see kernelagent/harness/child/cuda_build.py).
    backend: str = "triton"
    timeouts: StageTimeouts = field(default_factory=StageTimeouts)

    def __post_init__(self) -> None:
        """Refuse settings that would make a verdict meaningless (a NaN tolerance passes any
        output) or a run impossible. ValueError with the field's name, one line."""
        for name in ("atol", "rtol"):
            if getattr(self, name) is not None:
                _require_number(name, getattr(self, name), minimum=0)
        _require_int("trials", self.trials, minimum=1)
        if self.seed is not None:
            _require_int("seed", self.seed, minimum=0)
        for name in ("weight_seed", "heavy_op_min_elements", "derived_checks"):
            _require_int(name, getattr(self, name), minimum=0)
        for name in ("min_reps", "max_reps", "rotating_input_sets"):
            _require_int(name, getattr(self, name), minimum=1)
        if self.max_reps < self.min_reps:
            raise ValueError(f"max_reps ({self.max_reps}) must be >= min_reps ({self.min_reps})")
        for name in ("warmup_ms", "target_ms"):
            _require_number(name, getattr(self, name), minimum=0)
        _require_number("launch_cover_us", self.launch_cover_us, minimum=0, maximum=10_000)
        _require_number("roofline_margin", self.roofline_margin, minimum=0)
        if self.evidence not in ("trace", "ncu"):
            raise ValueError(f"evidence must be 'trace' or 'ncu', not {self.evidence!r}")
        _require_number("audit_share", self.audit_share, minimum=0, maximum=1)
        if not isinstance(self.trace, bool):
            raise ValueError(f"trace must be true or false, not {self.trace!r}")
        if self.min_own_device_share is not None:
            _require_number("min_own_device_share", self.min_own_device_share, minimum=0, maximum=1)
        if isinstance(self.compile_modes, (list, str)):
            self.compile_modes = (self.compile_modes,) if isinstance(self.compile_modes, str) else \
                tuple(self.compile_modes)
        unknown = [m for m in self.compile_modes if m not in INDUCTOR_MODES]
        if unknown:
            raise ValueError(f"unknown Inductor mode {unknown[0]!r} (use {', '.join(INDUCTOR_MODES)})")
        if self.static_check not in ("reject", "warn", "off"):
            raise ValueError(f"static_check must be reject, warn or off (got {self.static_check!r})")
        if self.torch_work not in ("reject", "allow"):
            raise ValueError(f"torch_work must be reject or allow (got {self.torch_work!r})")
        if isinstance(self.timeouts, dict):  # from JSON
            self.timeouts = StageTimeouts(**self.timeouts)
        if not isinstance(self.timeouts, StageTimeouts):
            raise ValueError(f"timeouts must be a StageTimeouts (got {type(self.timeouts).__name__})")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "EvalConfig":
        data = dict(data)
        timeouts = StageTimeouts(**data.pop("timeouts", {}))
        if "compile_modes" in data:
            data["compile_modes"] = tuple(data["compile_modes"])
        return cls(timeouts=timeouts, **data)

    def timing_key(self) -> str:
        """Hash of the settings that change a baseline timing (for the baseline cache)."""
        relevant = {
            k: getattr(self, k)
            for k in ("seed", "weight_seed", "warmup_ms", "target_ms", "min_reps", "max_reps",
                      "rotating_input_sets", "flush_l2", "launch_cover_us", "smoke_inputs_on_cpu")
        }
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def _require_number(name: str, value: object, minimum: float | None = None, maximum: float | None = None,
                    strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number (got {value!r})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number (got {value!r})")
    if minimum is not None and (value < minimum or (strict and value == minimum)):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum:g} (got {value!r})")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum:g} (got {value!r})")


# Every integer crosses the harness's protocol, which refuses any of 2**63 or more (bounded_json):
# with room for the offsets added to a seed.
MAX_INT = 2**62


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum} (got {value!r})")
    if value > MAX_INT:
        raise ValueError(f"{name} must be at most 2**62 (got {value!r})")


def tolerance_for(dtype_name: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """The (atol, rtol) to use for an output of `dtype_name`; explicit values win."""
    default_atol, default_rtol = DEFAULT_TOLERANCES.get(dtype_name, (1e-4, 1e-4))
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)
