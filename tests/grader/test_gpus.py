"""grader/gpus.py: one grading job per GPU, each pinned to its own, unless sharing is asked for."""
from __future__ import annotations

import threading

import pytest

from grader import gpus


def test_without_a_gpu_jobs_are_free():
    p = gpus.plan(4, devices=[])
    assert (p.jobs, p.devices, p.shared, p.note()) == (4, [], False, None)
    assert gpus.plan(None, devices=[]).jobs == 1
    with p.device() as d:
        assert d is None


@pytest.mark.parametrize("devices", [["0"], ["0", "1"], ["3", "5", "6", "7"]])
def test_default_is_one_job_per_gpu_each_on_its_own(devices):
    p = gpus.plan(None, devices=devices)
    assert p.jobs == len(devices) and not p.shared and p.note() is None
    held, lock, peak = {}, threading.Lock(), []

    def work():
        with p.device() as d:
            with lock:
                held[d] = held.get(d, 0) + 1
                peak.append(max(held.values()))
            threading.Event().wait(0.01)
            with lock:
                held[d] -= 1

    threads = [threading.Thread(target=work) for _ in range(3 * len(devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(peak) == 1 and set(held) == set(devices)  # never two workers on one GPU


def test_more_jobs_than_gpus_needs_share_and_is_recorded():
    with pytest.raises(gpus.GpuPlanError, match="--jobs 3 on 2 GPUs .* --share-gpus"):
        gpus.plan(3, devices=["0", "1"])
    p = gpus.plan(3, share=True, devices=["0", "1"])
    assert p.shared and "shared" in p.note() and "3 jobs on 2 GPUs" in p.note()
    assert not gpus.plan(2, share=True, devices=["0", "1"]).shared  # asked for, not needed


def test_visible_devices_follow_cuda_visible_devices(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,3")
    assert gpus.visible_devices() == ["GPU-aaaa", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpus.visible_devices() == ["0", "1"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpus.visible_devices() == []


def test_the_probe_answers_what_this_process_would(monkeypatch):
    """The child process asks the same functions: smoke mode (GPULAB_SMOKE forces it) and the devices."""
    from utils.course.env import smoke_mode

    assert gpus.Probe().result() == (smoke_mode(), gpus.visible_devices())
    monkeypatch.setenv("GPULAB_SMOKE", "1")
    assert gpus.Probe().result()[0] is True


def test_a_probe_that_fails_is_answered_here(monkeypatch):
    import subprocess
    import sys

    from utils.course.env import smoke_mode

    monkeypatch.setattr(gpus, "_PROBE", "import sys; print('not json'); sys.exit(3)")
    assert gpus.Probe().result() == (smoke_mode(), gpus.visible_devices())
    monkeypatch.setattr(gpus, "_PROBE", "print('{\"smoke\": \"yes\", \"devices\": 0}')")  # wrong types
    assert gpus.Probe().result() == (smoke_mode(), gpus.visible_devices())
    hung = gpus.Probe.__new__(gpus.Probe)
    hung._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert hung.result(timeout_s=0.5) == (smoke_mode(), gpus.visible_devices())
    assert hung._proc.poll() is not None  # the stuck child is gone
    hung.close()  # idempotent once the child is gone


def test_a_probe_not_asked_is_stopped():
    probe = gpus.Probe()
    probe.close()
    assert probe._proc.poll() is not None

