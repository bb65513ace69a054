"""utils.parallel.launch: what a failed multi-process launch says, and which failures get a second launch.

The failure texts are torchrun's own: each test launches real ``torch.distributed.run`` processes
(two ranks on CPU) whose second rank fails in a known way, so the summary block torchrun prints
(``error_file: <N/A>``, ``ChildFailedError``) is the one users see, not a copy of it.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader.labs.multi_gpu.sizes import BY_TIER
from utils.parallel import launch


def torchrun_output(tmp_path: Path, body: str) -> str:
    """stdout and stderr of ``torchrun --nproc_per_node 2`` on a script whose rank 1 runs ``body``."""
    script = tmp_path / "rank_fails.py"
    script.write_text(textwrap.dedent(f"""\
        import os, signal, sys, time
        if os.environ["RANK"] == "1":
        {textwrap.indent(textwrap.dedent(body), '    ')}
        time.sleep(1)
        """))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], capture_output=True, text=True, timeout=120, env=launch.launch_env(
                               launch.plan_for(0, True, "cpu", BY_TIER, str(tmp_path))))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc.stderr + "\n" + proc.stdout


@pytest.mark.slow
def test_a_ranks_exception_is_the_reason_not_torchruns_summary(tmp_path):
    text = torchrun_output(tmp_path, 'raise ValueError("the batch does not divide by the world size")')
    assert "ChildFailedError" in text or "error_file" in text, text[-2000:]  # torchrun framed it
    assert launch.why_failed(text) == "ValueError: the batch does not divide by the world size"
    assert launch.transient(text) is None  # a bug is not launched again


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named_and_is_the_machines(tmp_path):
    text = torchrun_output(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    why = launch.why_failed(text)
    assert "signal 9 (SIGKILL)" in why and "error_file" not in why, why
    assert launch.transient(text) == "sigkill"


def test_network_failures_are_the_machines_and_script_errors_are_not():
    machine = ["torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
               "address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
               "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] "
               "no error", "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"]
    for text in machine:
        assert launch.transient(text) is not None, text
    for text in ("train_multi_gpu.py: error: FSDP needs CUDA GPUs here", "KeyError: 'tokens_per_s_per_device'",
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"):
        assert launch.transient(text) is None, text
    assert launch.why_failed("") == "no output"


def _script(tmp_path: Path, name: str, code: str) -> list[str]:
    path = tmp_path / name
    path.write_text(code)
    return [sys.executable, str(path)]


def test_a_machine_failure_is_launched_once_more_and_a_bug_is_not(tmp_path, capsys):
    out = tmp_path / "run.json"
    flaky = _script(tmp_path, "flaky.py", "import sys\nprint('RuntimeError: Connection reset by peer', file=sys.stderr)\n"
                                          "sys.exit(1)\n")
    good = _script(tmp_path, "good.py", f"import json\njson.dump({{'ok': 1}}, open({str(out)!r}, 'w'))\n")
    cmds = iter([flaky, good])
    res = launch._launch(lambda: next(cmds), "fake run --out run.json", out, {}, 60, verbose=True)
    assert res["ok"] == 1 and res["file"] == str(out)
    assert "launching it once more" in capsys.readouterr().out
    assert (tmp_path / "run.attempt1.log").is_file() and "Connection reset" in (tmp_path / "run.attempt1.log").read_text()

    calls = []
    bug = _script(tmp_path, "bug.py", "raise KeyError('tokens_per_s_per_device')\n")
    with pytest.raises(RuntimeError, match=r"failed \(exit 1\): KeyError: 'tokens_per_s_per_device'; full log"):
        launch._launch(lambda: calls.append(1) or bug, "fake run --out run.json", out, {}, 60, verbose=False)
    assert len(calls) == 1  # not launched again

    calls.clear()
    with pytest.raises(RuntimeError, match="launched twice"):
        launch._launch(lambda: calls.append(1) or flaky, "fake run --out run.json", out, {}, 60, verbose=False)
    assert len(calls) == launch.LAUNCH_ATTEMPTS


def test_an_uncaught_cpp_exception_is_named_before_the_signal_it_raised():
    text = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
            "  what():  [enforce fail at gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 1046204 vs 1040256\n"
            "[rank1]: Signal 6 (SIGABRT) received by PID 4242\n")
    why = launch.why_failed(text)
    assert why.startswith("a rank aborted on an uncaught C++ exception (gloo::EnforceNotMet): [enforce fail"), why
    bare = "terminate called without an active exception\nSignal 6 (SIGABRT) received by PID 7"
    assert "without an active exception" in launch.why_failed(bare)
    assert "aborted itself" in launch.why_failed("Signal 6 (SIGABRT) received by PID 7")
