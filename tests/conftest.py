"""Shared fixtures. The harness fixtures start one harness server per test session (per xdist
worker): each evaluation still runs in fresh processes, but the server's imports are paid once.

The CPU suite runs in one process per core (`python -m pytest -q -n auto --dist loadgroup`, README
and .ci/run): pytest_xdist_auto_num_workers says how many, tests/xdist_locks.py which tests keep
apart (under any --dist), and `pytest.mark.xdist_group` keeps a file on one worker where its
module fixture is dear (each group goes whole to one worker, the other tests one by one)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests import server_zygote, xdist_locks
from tests.file_budget import pytest_runtest_protocol, pytest_runtest_setup  # noqa: F401 - hooks: each GPU file's own time budget

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
CANDIDATES = TESTS / "candidates"
BENCHMARKS = REPO / "benchmarks"
# The GPU files whose subject is not the kernel evidence (the KernelBench and benchmark solution
# sweeps) run without it, so that the whole GPU suite fits one device call: one ncu session per
# win, one at a time on a host, would add minutes. KERNELAGENT_GPU_EVIDENCE=1 turns it on there
# too (honest solutions must then still pass: a false rejection by the evidence shows).
GPU_SWEEP_EVIDENCE = os.environ.get("KERNELAGENT_GPU_EVIDENCE") == "1"

# Rich output in CLI tests renders at a fixed width.
os.environ.setdefault("COLUMNS", "120")

# No warm harness outlives the suite (issue 59): the CLI's commands use one by default, so the
# session runs them with their own servers, as `--no-daemon` does, and so does every process it
# starts with this environment. A test of the default deletes the variable (monkeypatch) and
# points KERNELAGENT_RUNTIME_DIR at its own folder (tests/test_daemon.py `runtime`).
os.environ.setdefault("KERNELAGENT_DAEMON", "0")

# One intra-op thread per process in a worker of a run spread over the cores (-n auto): the
# workers already fill every core, and two OpenMP threads per process spin for cores that are
# busy. Measured on the 2-core CI machine beside a running suite: a CPU evaluation's reference
# process burned 0.9-3.8 CPU-s with torch's default threads against 0.2 s with one, and the whole
# evaluation 4.8-7.3 CPU-s against 3.7-4.1. Set here, before anything imports torch; every
# harness server, reference and candidate process the worker starts inherits it (OMP_ is in
# the harness's environment allow-list). Outside xdist nothing changes.
if os.environ.get("PYTEST_XDIST_WORKER") and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) >= len(
        os.sched_getaffinity(0)):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# -- running in several processes (pytest-xdist) ------------------------------------------------
# At most this many workers for `-n auto`: each holds a harness server (torch imported) and its
# module fixtures, and the suite is CPU-bound (the harness's processes, the Triton interpreter).
MAX_WORKERS = 8
# .ci/run sets it (seconds since the epoch) so that the run's total shows above pytest's last line.
CI_STARTED = "KERNELAGENT_CI_STARTED"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(xdist_locks, "kernelagent-xdist-locks")
    # Harness servers fork from a process that has imported torch (tests/server_zygote.py). Not
    # in xdist's controller, which runs no test.
    is_controller = config.getoption("numprocesses", None) and not hasattr(config, "workerinput")
    if not is_controller and server_zygote.wanted(config.option.markexpr or ""):
        server_zygote.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    server_zygote.stop()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: `-p no:xdist` runs without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per CPU this process may run on (its affinity, not the host's
    count), at most MAX_WORKERS. No workers (0) when GPU tests are selected: they share one
    device and its server (cuda_evaluator), and their file budgets are wall time."""
    if "not gpu" not in (config.option.markexpr or "") and "gpu" in (config.option.markexpr or ""):
        return 0
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """`--dist loadgroup` groups by a suffix pytest-xdist writes into each grouped item's node
    id (`...@group`) on the workers. pytest 9.2 keeps a structured id and ignores that write, so
    with pytest-xdist 3.8 every `xdist_group` is silently ignored and its tests go round-robin
    (pytest-dev/pytest-xdist#1386, open; a fix is proposed in #1388). Here the same suffix goes
    into the structured id, once xdist's own hook has run; where xdist's write took effect (older
    pytest, or a fixed xdist) the id has its suffix already and nothing changes."""
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # a pytest without structured ids: xdist's write works there
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if not groups or "@" in item.nodeid.rpartition("]")[2] or not isinstance(getattr(item, "_id", None), NodeId):
            continue
        grouped = NodeId.parse(item.nodeid)
        object.__setattr__(grouped, "_str_cache", f"{item.nodeid}@{'_'.join(groups)}")
        item._id = grouped


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    started = os.environ.get(CI_STARTED, "").strip()
    if started and not hasattr(config, "workerinput"):
        try:
            total = time.time() - float(started)
        except ValueError:
            return
        terminalreporter.write_line(f"ci: {total:.0f} s since .ci/run started ({total / 60:.1f} minutes), "
                                    "install and docs build included")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory, request) -> Path:
    """One cache for the session, shared by its xdist workers (the baseline cache takes turns on
    a miss, BaselineCache.claim): a problem's baselines are timed once in the run."""
    if not hasattr(request.config, "workerinput"):
        return tmp_path_factory.mktemp("kernelagent-cache")
    shared = tmp_path_factory.getbasetemp().parent / "kernelagent-cache"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture
def eval_configs(monkeypatch) -> list:
    """The EvalConfig each `kernelagent eval` hands the harness, in order: the CLI's Evaluator is
    replaced by a recorder that answers `correct` without running anything."""
    import kernelagent.harness as harness
    from kernelagent.harness import EvalResult

    seen: list = []

    class Recorder:
        def __init__(self, **kwargs):
            pass

        def evaluate(self, problem, source, config):
            seen.append(config)
            return EvalResult(status="correct", correct=True, compiled=True)

        def close(self):
            pass

    monkeypatch.setattr(harness, "Evaluator", Recorder)
    return seen


@pytest.fixture(scope="session")
def evaluator(cache_dir):
    from kernelagent.harness import Evaluator

    with Evaluator(device="auto", cache_dir=cache_dir) as ev:
        yield ev


@pytest.fixture(scope="session")
def cuda_evaluator(cache_dir):
    """One harness server on the GPU for every GPU test file: its start (imports, the device
    probe) is paid once, and CUDA builds and compiled references are cached across the files.
    Files that submit their cases at once (submit_all) overlap their host work in it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kernelagent.harness import Evaluator

    with Evaluator(device="cuda", cache_dir=cache_dir) as ev:
        yield ev


class Submitted:
    """Cases handed to one evaluator at once; `[key]` waits for that case's result, and
    `.seconds[key]` is how long it took from submission (queueing beside the others included)."""

    def __init__(self, evaluator, cases: dict):
        import time
        from concurrent.futures import ThreadPoolExecutor

        self.seconds: dict = {}
        self._pool = ThreadPoolExecutor(max_workers=max(len(cases), 1))

        def run(key, args):
            start = time.monotonic()
            try:
                return evaluator.evaluate(*args)
            finally:
                self.seconds[key] = time.monotonic() - start

        self._futures = {key: self._pool.submit(run, key, args) for key, args in cases.items()}

    def __getitem__(self, key):
        return self._futures[key].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def relu_problem() -> Path:
    return CANDIDATES / "relu_problem.py"


@pytest.fixture
def fast_config():
    """Full checks with a short timing loop: the CPU timings mean nothing anyway."""
    from kernelagent.harness import EvalConfig, StageTimeouts

    return EvalConfig(trials=3, target_ms=20, warmup_ms=5, max_reps=20,
                      timeouts=StageTimeouts(start=60, load=30, compile=60, correctness=60, timing=60))
