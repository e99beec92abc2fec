"""How our code starts a job's processes on a GPU (child/common.py): the device count comes from
CUDA, never NVML, whose start-up spun past a job's start limit beside other jobs."""

from __future__ import annotations

import pytest
import torch


def test_devices_are_counted_through_cuda_not_nvml(monkeypatch):
    """count_devices_through_cuda caches CUDA's count where torch.cuda.device_count looks first,
    so torch's CUDA start-up never calls NVML; it leaves alone a torch without CUDA, a process
    whose CUDA has started and a count already cached."""
    import torch.cuda as tcuda

    from kernelagent.harness.child.common import count_devices_through_cuda

    def nvml(*_a):
        raise AssertionError("NVML was asked for the device count")

    monkeypatch.setattr(tcuda, "_device_count_nvml", nvml)
    monkeypatch.setattr(tcuda, "_cached_device_count", None)
    monkeypatch.setattr(tcuda, "_initialized", False)
    asked = []
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: asked.append(1) or 3, raising=False)
    monkeypatch.setattr(tcuda, "_is_compiled", lambda: False)
    count_devices_through_cuda()  # a CPU-only torch: nothing to count
    assert tcuda._cached_device_count is None and not asked
    monkeypatch.setattr(tcuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(tcuda, "_initialized", True)
    count_devices_through_cuda()  # CUDA already started: its own count stands
    assert tcuda._cached_device_count is None and not asked
    monkeypatch.setattr(tcuda, "_initialized", False)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: asked.append(0) or 0, raising=False)
    count_devices_through_cuda()  # CUDA finds none: torch's own start-up says so, nothing cached
    assert tcuda._cached_device_count is None and asked == [0]
    asked.clear()
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: asked.append(1) or 3, raising=False)
    count_devices_through_cuda()
    assert tcuda._cached_device_count == 3 and asked == [1]
    assert torch.cuda.device_count() == 3  # from the cache: NVML (above) would have raised
    count_devices_through_cuda()  # cached already: not asked again
    assert asked == [1]


@pytest.mark.gpu
def test_a_job_process_starts_cuda_without_nvml():
    """On a GPU, in a fresh process: our start (child/common.job_device, as the candidate's and the
    reference's processes run it) creates the context without one NVML call."""
    import subprocess
    import sys

    script = ("import torch, torch.cuda as tcuda\n"
              "calls = []\n"
              "real = tcuda._device_count_nvml\n"
              "tcuda._device_count_nvml = lambda: calls.append(1) or real()\n"
              "from kernelagent.harness.child.common import job_device\n"
              "device = job_device({'device': 'cuda:0'})\n"
              "torch.empty(1, device=device).add_(1)\n"
              "torch.cuda.synchronize()\n"
              "assert tcuda.is_initialized() and not calls, calls\n"
              "assert torch.cuda.device_count() >= 1\n"
              "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
