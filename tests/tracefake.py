"""A small builder of kernel traces as the tracer writes them (TRACE_SPEC.md "Records"): JSON Lines
bytes, seq numbered in order, markers with the contract's grid and block, on a device clock that
moves forward as the main stream's work is queued. tests/test_trace_rules.py builds its honest
and hostile traces with it and runs them through records.decode and rules.judge.

`process(body, ...)` lays out a whole traced process as the harness runs it: hello, the first
call, the checks, then the timed loop as child/timing.py queues each call (input generation,
the L2 flush's fill, the launch cover's spin, begin marker, the call, end marker, the output
copied aside), then the final flush. `body(fake, phase, index)` queues what one call runs.
"""

from __future__ import annotations

import json
from typing import Any, Callable

MARKER = "kernelagent_trace_marker"
PHASE = {"first": 1, "check": 2, "timed": 3, "warmup": 4}
US = 1_000  # ns
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1> >(int, at::native::FillFunctor<float>, std::array<char*, 1>)"
COPY = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<...>)"
SPIN = "_ZN2at4cuda75_GLOBAL__N__d2f9a8f5_8_Sleep_cu_12f0e10c_1234511spin_kernelEl"
NORMAL = "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, at::native::templates::cuda::normal_and_transform<float, float, at::CUDAGeneratorImpl*>(...)>(long, at::PhiloxCudaState, ...)"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"


class TraceFake:
    def __init__(self, *, ctx: int = 1, dev: int = 0, stream: int = 7, t0: int = 1_000_000_000):
        self.ctx, self.dev, self.stream = ctx, dev, stream
        self.now = t0
        self.corr = 0
        self.lines: list[dict[str, Any]] = []

    # -- records -------------------------------------------------------------------
    def hello(self) -> dict[str, Any]:
        return self._add({"t": "hello", "v": 1, "pid": 4242, "cupti": 26, "ts": self.now})

    def kernel(self, name: str, dur_ns: int, *, gap: int = 1 * US, stream: int | None = None, ctx: int | None = None,
               start: int | None = None, grid: tuple[int, int, int] = (128, 1, 1),
               block: tuple[int, int, int] = (256, 1, 1), graph: int = 0, corr: int | None = None) -> dict[str, Any]:
        """A kernel; on the main stream (no `start`) it runs after what was queued before it."""
        begin = self.now + gap if start is None else start
        if start is None:
            self.now = begin + dur_ns
        return self._add({"t": "kernel", "name": name, "corr": self._corr(corr), "ctx": self.ctx if ctx is None else ctx,
                          "dev": self.dev, "stream": self.stream if stream is None else stream,
                          "grid": list(grid), "block": list(block), "start": begin, "end": begin + dur_ns,
                          "graph": graph})

    def memset(self, nbytes: int, dur_ns: int, *, gap: int = 1 * US) -> dict[str, Any]:
        begin = self.now + gap
        self.now = begin + dur_ns
        return self._add({"t": "memset", "bytes": nbytes, "ctx": self.ctx, "dev": self.dev, "stream": self.stream,
                          "start": begin, "end": begin + dur_ns, "corr": self._corr(None)})

    def memcpy(self, nbytes: int, dur_ns: int, *, kind: int = 8, gap: int = 1 * US) -> dict[str, Any]:
        begin = self.now + gap
        self.now = begin + dur_ns
        return self._add({"t": "memcpy", "kind": kind, "bytes": nbytes, "ctx": self.ctx, "dev": self.dev,
                          "stream": self.stream, "start": begin, "end": begin + dur_ns, "corr": self._corr(None)})

    def marker(self, phase: str, index: int, side: int) -> dict[str, Any]:
        return self.kernel(MARKER, 2 * US, grid=(index + 1, PHASE[phase], side), block=(1, 1, 1))

    def flush(self, final: bool = False, mark: int | None = None) -> dict[str, Any]:
        if mark is None:
            mark = sum(1 for r in self.lines if r["t"] == "flush")
        return self._add({"t": "flush", "mark": mark, "final": int(final), "ts": self.now + 50 * US})

    def dropped(self, n: int) -> dict[str, Any]:
        return self._add({"t": "dropped", "n": n})

    def idle(self, ns: int) -> None:
        """The device does nothing traced for `ns` (the host is busy, or untraced work runs)."""
        self.now += ns

    # -- calls ---------------------------------------------------------------------
    def call(self, phase: str, index: int, body: Callable[["TraceFake", str, int], None]) -> None:
        self.marker(phase, index, 1)
        body(self, phase, index)
        self.marker(phase, index, 2)

    def to_bytes(self) -> bytes:
        return b"".join(line_bytes(dict(seq=i, **r)) for i, r in enumerate(self.lines))

    def _corr(self, corr: int | None) -> int:
        if corr is not None:
            return corr
        self.corr += 1
        return self.corr

    def _add(self, record: dict[str, Any]) -> dict[str, Any]:
        self.lines.append(record)
        return record


def line_bytes(record: dict[str, Any]) -> bytes:
    """One record as the tracer writes it: ASCII, no spaces, one line."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


def one(name: str, dur_us: float = 50) -> Callable[[TraceFake, str, int], None]:
    """A call body: one kernel of `name`."""
    return lambda fake, phase, index: fake.kernel(name, int(dur_us * US))


def process(body: Callable[[TraceFake, str, int], None], *, checks: int = 3, warmups: int = 2, segments: int = 2,
            calls: int = 4, first: Callable[[TraceFake, str, int], None] | None = None,
            between: Callable[[TraceFake, int], None] | None = None, final: bool = True,
            fake: TraceFake | None = None) -> TraceFake:
    """A whole traced process, as the harness runs it (module docstring). `between(fake, n)`
    queues extra work after the n-th loop call (warm-ups and timed calls counted together)."""
    fake = fake or TraceFake()
    fake.hello()
    fake.kernel(FILL, 3 * US)  # the harness's own start (poisoning freed memory, inputs)
    fake.call("first", 0, first or body)
    for index in range(checks):
        fake.kernel(NORMAL, 4 * US)  # the check's inputs
        fake.kernel(FILL, 6 * US)  # poisoning the allocator's free memory
        fake.call("check", index, body)
        fake.flush()
    n = 0
    for phase, count, index_base in [("warmup", warmups, 0)] + [("timed", calls, 0)] * segments:
        for index in range(index_base, index_base + count):
            fake.kernel(NORMAL, 4 * US)  # the call's fresh inputs
            fake.kernel(FILL, 20 * US)  # the L2 flush
            fake.idle(15 * US)  # the synchronize
            fake.kernel(SPIN, 400 * US)  # the launch cover
            fake.call(phase, index, body)
            if phase == "timed":
                fake.kernel(COPY, 2 * US)  # the output copied aside
            if between is not None:
                between(fake, n)
            n += 1
        fake.flush()
    if final:
        fake.flush(final=True)
    return fake
