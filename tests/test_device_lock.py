"""One harness server at a time on a GPU (server/device_lock.py): the lock file per device, and
Admission taking it for a server's busy period, so that a second server's jobs (another
`kernelagent eval`, a benchmark's fresh process) wait instead of running beside the first's.
The locks are real flock(2) locks on files in a temporary directory; no GPU is needed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from kernelagent.harness.server import device_lock as dl
from kernelagent.harness.server.admission import Admission

GPU = {"cuda": True, "uuid": "GPU-1234-abcd", "pci_bus_id": "00000000:19:00.0"}


def test_the_device_key_is_its_uuid_else_its_bus_id_else_the_visible_device(monkeypatch):
    assert dl.device_key(GPU) == "uuid:gpu-1234-abcd"
    assert dl.device_key(dict(GPU, uuid=None)) == "pci_bus_id:00000000:19:00.0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert dl.device_key({"cuda": True}) == "visible:3"
    assert dl.device_key({"cuda": False, "uuid": "x"}) is None
    assert dl.DeviceLock.for_fingerprint({"cuda": False}) is None
    monkeypatch.setenv("KERNELAGENT_DEVICE_LOCK", "0")
    assert dl.DeviceLock.for_fingerprint(GPU) is None


def test_a_second_holder_waits_and_times_out_then_gets_it(tmp_path):
    first, second = dl.DeviceLock("uuid:a", tmp_path), dl.DeviceLock("uuid:a", tmp_path, wait_s=0.3)
    assert first.acquire()["device_lock"] == "held" and first.held
    started = time.monotonic()
    info = second.acquire()
    assert info["device_lock"].startswith("timed out") and not second.held
    assert 0.3 <= time.monotonic() - started < 3 and info["device_lock_wait_s"] >= 0.3
    assert dl.DeviceLock("uuid:b", tmp_path, wait_s=0).acquire()["device_lock"] == "held"  # another GPU
    first.release()
    assert second.acquire()["device_lock"] == "held"
    second.release()
    assert oct(os.stat(tmp_path / first.path.name).st_mode & 0o777) == oct(0o666)


def test_a_server_that_dies_leaves_nothing_held(tmp_path):
    """The kernel drops a flock with its process: a killed server never blocks the next."""
    lock = dl.DeviceLock("uuid:a", tmp_path, wait_s=10)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
         " fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(lock.path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        threading.Timer(0.5, holder.kill).start()
        started = time.monotonic()
        assert lock.acquire()["device_lock"] == "held"
        assert 0.4 < time.monotonic() - started < 8
    finally:
        holder.kill()
        holder.wait()
        lock.release()


def test_a_lock_directory_others_could_swap_files_in_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # world-writable without the sticky bit
    info = dl.DeviceLock("uuid:a", shared).acquire()
    assert info["device_lock"].startswith("unavailable") and "sticky" in info["device_lock"]
    os.chmod(shared, 0o1777)
    lock = dl.DeviceLock("uuid:a", shared)
    assert lock.acquire()["device_lock"] == "held"
    lock.release()
    # a symlink in place of the lock file is not followed
    target = tmp_path / "elsewhere"
    target.write_text("")
    lock.path.unlink()
    lock.path.symlink_to(target)
    assert dl.DeviceLock("uuid:a", shared).acquire()["device_lock"].startswith("unavailable")
    link = tmp_path / "linkdir"
    link.symlink_to(shared)
    assert "not a directory" in dl.DeviceLock("uuid:a", link).acquire()["device_lock"]


def test_admission_holds_the_lock_for_its_busy_period_only(tmp_path):
    lock = dl.DeviceLock("uuid:a", tmp_path)
    admission = Admission(4, device_lock=lock)
    probe = dl.DeviceLock("uuid:a", tmp_path, wait_s=0)
    with admission.admit() as first:
        assert first["device_lock"] == "held" and lock.held
        with admission.admit() as second:  # same busy period: no second acquire
            assert second == {"device_lock": "held", "device_lock_wait_s": 0.0}
        assert lock.held and probe.acquire()["device_lock"].startswith("timed out")
    assert not lock.held
    assert probe.acquire()["device_lock"] == "held"  # released when the last job ended
    probe.release()
    assert Admission(2).device_lock is None  # the CPU: nothing to take


def test_two_servers_on_one_gpu_never_run_jobs_at_once(tmp_path):
    """Each 'server' (an Admission with its own DeviceLock on the same key) runs several jobs at
    once; no job of one overlaps a job of the other, and the waiting one's result records its
    wait."""
    spans: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
    infos: dict[str, list[dict]] = {"a": [], "b": []}
    admissions = {name: Admission(3, device_lock=dl.DeviceLock("uuid:same", tmp_path)) for name in spans}

    def job(name: str, delay: float) -> None:
        time.sleep(delay)
        with admissions[name].admit() as info:
            start = time.monotonic()
            time.sleep(0.2)
            spans[name].append((start, time.monotonic()))
            infos[name].append(info)

    threads = [threading.Thread(target=job, args=(name, 0.05 * i + (0.02 if name == "b" else 0)))
               for i in range(3) for name in spans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert all(len(v) == 3 for v in spans.values())
    for a0, a1 in spans["a"]:
        for b0, b1 in spans["b"]:
            assert a1 <= b0 or b1 <= a0, (spans, infos)
    waited = [i["device_lock_wait_s"] for v in infos.values() for i in v]
    assert max(waited) >= 0.1  # the second server's first job waited for the first's busy period
    assert all(i["device_lock"] == "held" for v in infos.values() for i in v)


@pytest.mark.parametrize("alone", [False, True])
def test_a_job_admitted_while_the_lock_is_being_taken_waits_for_it(tmp_path, alone):
    """Jobs admitted while the first is still waiting for another server's lock do not start
    before it is held."""
    other = dl.DeviceLock("uuid:a", tmp_path)
    assert other.acquire()["device_lock"] == "held"
    admission = Admission(4, device_lock=dl.DeviceLock("uuid:a", tmp_path))
    started: list[float] = []

    def job() -> None:
        with admission.admit(alone=alone):
            started.append(time.monotonic())

    threads = [threading.Thread(target=job) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.4)
    assert started == [] and admission.running() >= 1
    released = time.monotonic()
    other.release()
    for t in threads:
        t.join(10)
    assert len(started) == 3 and min(started) >= released
