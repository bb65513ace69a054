"""`python -m utils` and `python -m utils --json` on this machine."""
import json
import subprocess
import sys

from utils.course.env import repo_root


def _run(*args):
    return subprocess.run([sys.executable, "-m", "utils", *args], cwd=repo_root(), capture_output=True, text=True, timeout=120)


def test_json_report_has_the_documented_keys():
    out = _run("--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert {"device", "nvml", "torch", "environment", "smoke"} <= set(rep)
    dev = rep["device"]
    assert dev["kind"] in ("gpu", "cpu") and dev["name"]
    assert set(dev["peak_tflops"]) == {"bf16", "fp16", "tf32", "fp32"}
    assert "bandwidth_gbs" in dev and "memory_gib" in dev
    assert isinstance(rep["nvml"]["available"], bool)
    if not rep["nvml"]["available"]:
        assert rep["nvml"]["reason"]
    if dev["kind"] == "cpu":
        assert rep["smoke"] is True


def test_table_report_for_a_person():
    out = _run()
    assert out.returncode == 0, out.stderr
    assert "device" in out.stdout and "smoke mode" in out.stdout and "NVML" in out.stdout


def test_bad_flag_is_one_line_usage_error():
    out = _run("--nope")
    assert out.returncode == 2 and "unrecognized arguments" in out.stderr
    assert "Traceback" not in out.stderr
