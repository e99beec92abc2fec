"""What a full-size KernelBench evaluation holds on the device, against what the server's memory
ledger reserved for it: each solution evaluated ALONE, while a thread reads NVML's used memory
every 20 ms (the peak over the job, less what was used before it). The KernelBench batch of
tests/test_kernelbench_solutions.py ran out of memory beside others on an H200 (2026-11-28):
10 of 25 re-run alone.   python3 scripts/device/memory_probe.py [level1/19_ReLU ...]"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
KB = ROOT.parent / "shared" / "kernelbench" / "KernelBench"
SOLUTIONS = ROOT / "benchmarks" / "kernelbench_solutions"
DEFAULT = ["level1/19_ReLU", "level1/23_Softmax", "level1/36_RMSNorm_", "level1/38_L1Norm_",
           "level1/45_Average_Pooling_2D", "level1/3_Batched_matrix_multiplication"]


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", default=DEFAULT, help="KernelBench keys with a solution")
    args = parser.parse_args()
    from kernelagent.harness import EvalConfig, Evaluator
    from kernelagent.harness.child.sm_clocks import Nvml, torch_device_ids

    nvml = Nvml.open()
    handle = nvml.handle(**torch_device_ids(0))

    def used() -> int:
        return nvml.memory_info(handle)[2]

    gib = 1 << 30
    config = EvalConfig(baselines=False)
    with Evaluator(device="cuda") as ev:
        for key in args.problems:
            peak, stop = [0], threading.Event()
            before = used()

            def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], used())
                    time.sleep(0.02)

            thread = threading.Thread(target=sample, daemon=True)
            thread.start()
            started = time.monotonic()
            result = ev.evaluate(KB / f"{key}.py", (SOLUTIONS / f"{key}.py").read_text(), config)
            stop.set()
            thread.join()
            c, m = result.concurrency, result.memory
            print(f"{key}: {result.status} in {time.monotonic() - started:.1f} s; reserved "
                  f"{(c.get('memory_reserved_bytes') or 0) / gib:.2f} GiB; NVML peak over the job "
                  f"{(peak[0] - before) / gib:.2f} GiB; io {m.get('io_bytes', 0) / gib:.2f} GiB; peaks ref "
                  f"{(m.get('peak_reference_bytes') or 0) / gib:.2f} cand {(m.get('peak_candidate_bytes') or 0) / gib:.2f} GiB; "
                  f"retried alone {c.get('retried_alone')}; {result.reason[:160]!r}", flush=True)


if __name__ == "__main__":
    main()
