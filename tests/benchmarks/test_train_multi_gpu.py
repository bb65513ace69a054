"""benchmarks/train_multi_gpu.py and its multi_gpu_*.py modules: a real two-process DDP run over gloo, bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import ACCELERATE_LAUNCH, free_port, load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "train_multi_gpu.py"
CONFIGS = ROOT / "benchmarks" / "accelerate"
LAUNCH = ACCELERATE_LAUNCH


tmg = load_script(SCRIPT)  # puts the repository root on sys.path: its modules import as benchmarks.*
from benchmarks import multi_gpu_checks as checks  # noqa: E402
from benchmarks import multi_gpu_measure as measure  # noqa: E402
from benchmarks import multi_gpu_wrap as wrap  # noqa: E402


def _one_line_error(capsys, rc: int, needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("train_multi_gpu.py: error:") and needle in err, err


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One real `accelerate launch` of the DDP config with 2 CPU processes, with every option
    that changes the loop (accumulation, --measure-comm, --baseline) and DDP's bucket knobs."""
    d = tmp_path_factory.mktemp("ddp")
    base = d / "one_gpu.json"
    base.write_text(json.dumps({"world_size": 1, "total_tokens_per_s": 1000.0,
                                "config": {"preset": "gpt2-tiny", "batch_per_device": 2, "seq": 32, "grad_accum": 2}}))
    out = d / "ddp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "GPULAB_SMOKE": "1"}
    cmd = [*LAUNCH, "--config_file", str(CONFIGS / "ddp.yaml"), "--num_processes", "2",
           "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
           str(SCRIPT), "--out", str(out), "--preset", "gpt2-tiny", "--batch-per-device", "2", "--seq", "32",
           "--steps", "3", "--warmup", "1", "--grad-accum", "2", "--measure-comm", "--baseline", str(base),
           "--bucket-mb", "1", "--bucket-view", "--profile", str(d / "prof")]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def test_ddp_two_cpu_processes(ddp_run):
    r = ddp_run
    assert r["world_size"] == 2 and r["distributed_type"] == "MULTI_CPU"
    assert [x["rank"] for x in r["per_rank"]] == [0, 1]
    tps = [x["tokens_per_s"] for x in r["per_rank"]]
    assert all(t > 0 for t in tps)
    assert r["total_tokens_per_s"] == pytest.approx(sum(tps))
    assert r["slowest_rank_tokens_per_s"] == min(tps)
    assert r["total_tokens_per_s_slowest_bound"] == pytest.approx(2 * min(tps))
    assert r["tokens_per_step_per_device"] == 2 * 32 * 2
    for x in r["per_rank"]:
        assert x["steps"] == 3 and x["warmup_steps"] == 1 and len(x["step_times_ms"]) == 3
        # tokens/s is exactly the measured tokens over the measured time
        assert x["tokens_per_s"] == pytest.approx(3 * 128 / x["total_s"])
        assert 0.0 <= x["exposed_comm_share"] < 1.0
    assert r["exposed_comm_share"] == max(x["exposed_comm_share"] for x in r["per_rank"])
    # read back from DDP itself: the options reached the wrapper
    assert r["ddp"] == {"bucket_cap_mb": 1.0, "comm_hook": "none", "gradient_as_bucket_view": True}
    # the all-reduce really ran: both replicas hold the same weights after the synced steps
    assert r["replicas_identical"] is True
    assert r["per_rank"][0]["param_checksum"] == r["per_rank"][1]["param_checksum"] != 0.0


def test_ddp_loss_per_step(ddp_run):
    """Each rank's loss for every synchronised step (warm-up included), read once the loop ended.
    Random GPT-2 weights predict nearly uniformly, so the first loss is close to ln(vocab)."""
    import math

    for x in ddp_run["per_rank"]:
        losses = x["loss_per_step"]
        assert len(losses) == 1 + 3 and all(math.isfinite(v) for v in losses)
        assert losses[0] == pytest.approx(math.log(4096), abs=0.5)
    # the ranks train on disjoint shards, so their losses differ
    assert ddp_run["per_rank"][0]["loss_per_step"] != ddp_run["per_rank"][1]["loss_per_step"]


def test_ddp_profile_per_rank(ddp_run):
    """--profile: each rank profiled its own steps and kept its trace; gloo runs no GPU kernels,
    so there is no communication kernel to measure (comm is None, not zero)."""
    for x in ddp_run["per_rank"]:
        prof = x["profile"]
        assert Path(prof["trace"]).name == f"trace_rank{x['rank']}.json" and Path(prof["trace"]).stat().st_size > 0
        assert prof["step_time_ms"] > 0 and prof["gpu_idle_fraction"] is None and prof["comm"] is None


def test_replica_check_catches_drift():
    assert measure.replicas_identical([608.4883984728442, 608.4883984728442])
    assert not measure.replicas_identical([608.4883984728442, 608.4884])  # one rank skipped an all-reduce
    assert measure.replicas_identical([1e12, 1e12 + 100.0])  # within float64 summation noise at that size


def test_ddp_record_fields(ddp_run):
    r = ddp_run
    assert r["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert r["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and r["env"]["NVSHMEM_DISABLE_NVLS"] == "1"
    from utils.measure.record import utils_hash

    assert r["utils_sha256"] == utils_hash()
    assert r["fingerprint"]["kind"] == "cpu"
    assert r["mfu_per_device"] is None and r["mfu_note"]  # a CPU has no datasheet peak
    assert r["flops_per_token"] > 0
    # per-device efficiency against the (made-up) 1000 tokens/s baseline
    assert r["scaling_efficiency"] == pytest.approx(r["tokens_per_s_per_device"] / 1000.0)
    # not compiled: the DDP-optimizer setting is recorded and the Dynamo config was not touched
    assert r["config"]["ddp_optimizer"] == "ddp_optimizer" and r["dynamo_optimize_ddp"] is None


@pytest.mark.parametrize("name, strategy", [("fsdp_full_shard.yaml", "FULL_SHARD"),
                                            ("fsdp_shard_grad_op.yaml", "SHARD_GRAD_OP")])
def test_fsdp_configs_parse_with_accelerate(name, strategy):
    cfg = checks.check_config(CONFIGS / name)
    assert cfg["distributed_type"] == "FSDP"
    assert cfg["fsdp_config"]["fsdp_reshard_after_forward"] == strategy
    assert cfg["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "GPT2Block"
    # the environment `accelerate launch` hands the processes: FSDP1's plugin reads the strategy
    # from FSDP_SHARDING_STRATEGY, which launch sets to FULL_SHARD unless the config names one
    # (a SHARD_GRAD_OP config with fsdp_reshard_after_forward alone ran FULL_SHARD on 2 H200s)
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / name), "--num_processes", "2", "x.py"])
    env = prepare_multi_gpu_env(_validate_launch_command(args)[0])
    assert env["FSDP_SHARDING_STRATEGY"] == strategy
    assert checks.launch_family(env) == "FSDP1"  # what --baseline must match


def test_fsdp2_config_reaches_the_launch_environment():
    cfg = checks.check_config(CONFIGS / "fsdp2_full_shard.yaml")
    assert cfg["distributed_type"] == "FSDP" and cfg["fsdp_config"]["fsdp_version"] == 2
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / "fsdp2_full_shard.yaml"),
                                               "--num_processes", "2", "x.py"])
    env = prepare_multi_gpu_env(_validate_launch_command(args)[0])
    assert env["FSDP_VERSION"] == "2" and env["FSDP_RESHARD_AFTER_FORWARD"] == "true"
    assert checks.launch_family(env) == "FSDP2"  # what --baseline must match


def test_ddp_config_parses():
    assert checks.check_config(CONFIGS / "ddp.yaml")["distributed_type"] == "MULTI_GPU"


@pytest.mark.parametrize("env, needle", [("ACCELERATE_USE_FSDP", "FSDP needs CUDA"),
                                         ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed needs CUDA GPUs here")])
def test_sharded_engines_refused_on_cpu(monkeypatch, capsys, tmp_path, env, needle):
    """On CPU processes Accelerate would run plain DDP instead (or, for DeepSpeed, miscount the
    ranks), so the script says so in one line."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("FSDP and DeepSpeed run on this machine")
    monkeypatch.setenv(env, "true")
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny"])
    _one_line_error(capsys, rc, needle)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_configs_reach_the_launch_environment(stage):
    """Each ZeRO config parses with Accelerate's loader, and `accelerate launch` hands its
    processes DeepSpeed with that stage (what Accelerate's DeepSpeedPlugin reads)."""
    cfg = checks.check_config(CONFIGS / f"deepspeed_zero{stage}.yaml")
    assert cfg["distributed_type"] == "DEEPSPEED" and cfg["deepspeed_config"]["zero_stage"] == stage
    assert "gradient_clipping" not in cfg["deepspeed_config"]  # the script turns clipping off itself
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / f"deepspeed_zero{stage}.yaml"),
                                               "--num_processes", "2", "x.py"])
    args, defaults, _ = _validate_launch_command(args)
    # launch_command lists the DeepSpeed fields the config file set before it calls the launcher
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    _, env = prepare_deepspeed_cmd_env(args)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == str(stage)
    assert checks.launch_family(env) == f"DeepSpeed ZeRO-{stage}"  # what --baseline must match


@pytest.mark.parametrize("argv, needle", [
    ([], "deepspeed is not installed: pip install deepspeed"),
    (["--compile"], "--compile is a DDP/torch.compile option"),
    (["--measure-comm"], "drop --measure-comm"),
    (["--grad-accum", "2"], "drop --grad-accum"),
    (["--bucket-mb", "200"], "drop --bucket-mb"),
])
def test_deepspeed_checks_on_a_gpu_machine(monkeypatch, capsys, tmp_path, argv, needle):
    """As on a GPU machine: DeepSpeed missing, or an option the engine would silently ignore."""
    import importlib.util

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setattr(checks, "cpu_run", lambda: False)
    installed = bool(argv)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if installed else None) if name == "deepspeed" else real(name, *a))
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", *argv])
    _one_line_error(capsys, rc, needle)


def test_bf16_comm_hook_refused_on_cpu(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the hook runs on this machine")
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--comm-hook", "bf16"])
    _one_line_error(capsys, rc, "--comm-hook bf16 needs CUDA")


def test_missing_config_file(capsys, tmp_path):
    _one_line_error(capsys, tmg.main(["--check-config", str(tmp_path / "nope.yaml")]), "does not exist")


def test_bad_preset(capsys, tmp_path):
    _one_line_error(capsys, tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt9"]), "unknown preset 'gpt9'")


@pytest.mark.parametrize("extra, needle", [(["--steps", "0"], "--steps must be >= 1"),
                                           (["--grad-accum", "0"], "--grad-accum must be >= 1")])
def test_bad_counts(capsys, tmp_path, extra, needle):
    _one_line_error(capsys, tmg.main(["--out", str(tmp_path / "x.json"), *extra]), needle)


def test_ddp_optimizer_needs_compile(capsys, tmp_path):
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--ddp-optimizer", "no_optimization"])
    _one_line_error(capsys, rc, "--ddp-optimizer no_optimization only changes how torch.compile splits the graph")


def test_python_reducer_refuses_comm_hook(capsys, tmp_path):
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--compile",
                   "--ddp-optimizer", "python_reducer", "--comm-hook", "bf16"])
    _one_line_error(capsys, rc, "drop --comm-hook")


def test_python_reducer_refuses_fsdp(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "false")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # as on a GPU machine: the mode check comes first
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--compile", "--ddp-optimizer", "python_reducer"])
    _one_line_error(capsys, rc, "python_reducer is a DDP mode")


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile on a CPU needs a C++ compiler")
@pytest.mark.parametrize("reorder", [None, "passes"], ids=["as_compiled", "comm_reorder"])
def test_python_reducer_compiled_on_two_cpu_processes(tmp_path, reorder):
    """The Compiled Autograd path the 2-GPU run takes, on gloo: the backward is captured, the
    all-reduces it traced keep the replicas identical, and the mode is recorded; the same with
    Inductor's compute/communication reordering."""
    out = tmp_path / "pyred.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*LAUNCH, "--config_file", str(CONFIGS / "ddp.yaml"), "--num_processes", "2",
           "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
           str(SCRIPT), "--out", str(out), "--preset", "gpt2-tiny", "--batch-per-device", "2", "--seq", "32",
           "--steps", "2", "--warmup", "1", "--compile", "--ddp-optimizer", "python_reducer"] + (["--comm-reorder"] if reorder else [])
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["dynamo_optimize_ddp"] == "python_reducer" and r["compiled_autograd"] is True
    assert r["dynamo_counters"]["compiled_autograd_captures"] >= 1
    assert r["replicas_identical"] is True and r["config"]["comm_reorder"] == reorder


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile on a CPU needs a C++ compiler")
def test_compile_scope_loss_trains_the_same_under_ddp(tmp_path):
    """--compile-scope loss puts the model inside a module returning only the loss, inside DDP,
    and compiles that; --compile-scope model compiles DDP over the Hugging Face model (whose
    outputs, logits included, leave the graph). Two gloo processes each: the same computation,
    so in fp32 the losses step for step are equal and the all-reduce still keeps the replicas
    identical. Dynamo's own listing of the graph it compiled (TORCH_LOGS=graph_code) shows what
    leaves it: the logits with the model scope, the loss alone with the loss scope; the breaks
    (DDP's own forward, which Dynamo skips) are the same. A 1-process baseline is refused."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "TORCH_LOGS": "graph_code"}
    runs, returns = {}, {}
    for scope in ("model", "loss"):
        out = tmp_path / f"{scope}.json"
        cmd = [*LAUNCH, "--config_file", str(CONFIGS / "ddp.yaml"), "--num_processes", "2",
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
               str(SCRIPT), "--out", str(out), "--preset", "gpt2-tiny", "--batch-per-device", "2",
               "--seq", "32", "--steps", "2", "--warmup", "1", "--compile", "--compile-scope", scope]
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[scope] = json.loads(out.read_text())
        returns[scope] = {ln.split("return ", 1)[1].strip() for ln in (p.stdout + p.stderr).splitlines()
                          if ln.startswith("[rank0]") and "[__graph_code]" in ln and "return (" in ln}
    assert returns == {"model": {"(loss, logits)"}, "loss": {"(loss,)"}}
    loss, model = runs["loss"], runs["model"]
    assert loss["config"]["compile_scope"] == "loss" and model["config"]["compile_scope"] == "model"
    assert loss["world_size"] == 2 and loss["sharding_strategy"] == "DDP (replicated)"
    assert loss["dynamo_counters"] == model["dynamo_counters"]
    assert loss["replicas_identical"] is True
    for rank in (0, 1):
        assert loss["per_rank"][rank]["loss_per_step"] == pytest.approx(model["per_rank"][rank]["loss_per_step"],
                                                                         rel=1e-5)
    assert loss["per_rank"][0]["param_checksum"] == pytest.approx(model["per_rank"][0]["param_checksum"], rel=1e-6)
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny",
                        "--batch-per-device", "2", "--seq", "32", "--compile", "--compile-scope", "loss",
                        "--baseline", str(tmp_path / "model.json")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "has world_size 2" in p.stderr


def test_compile_scope_needs_compile(capsys, tmp_path):
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--compile-scope", "loss"])
    _one_line_error(capsys, rc, "--compile-scope loss changes what --compile wraps; add --compile")


def test_compile_scope_loss_is_not_for_fsdp(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # as accelerate launch sets it for an FSDP config
    monkeypatch.setattr(checks, "cpu_run", lambda: False)  # on a CPU FSDP itself is refused first
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--compile", "--compile-scope", "loss"])
    _one_line_error(capsys, rc, "--compile-scope loss is for DDP and one process")


def test_compile_scope_baselines_must_match(tmp_path, capsys):
    """A loss-scope run against a model-scope 1-GPU run (or the reverse) is refused: the scope alone
    moved the 1-GPU step by 13% on an H200 (RESULTS.md)."""
    base = tmp_path / "b.json"
    base.write_text(json.dumps({"world_size": 1, "total_tokens_per_s": 1.0, "config": {
        "preset": "gpt2-tiny", "batch_per_device": 2, "seq": 32, "grad_accum": 1, "compile": True,
        "compile_scope": "model"}}))
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--batch-per-device", "2",
                   "--seq", "32", "--compile", "--compile-scope", "loss", "--baseline", str(base)])
    _one_line_error(capsys, rc, "has compile_scope='model', this run 'loss'")


def test_comm_reorder_needs_python_reducer(capsys, tmp_path):
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--compile", "--comm-reorder"])
    _one_line_error(capsys, rc, "--comm-reorder reorders the all-reduces Compiled Autograd traced")


@pytest.mark.parametrize("base_cfg, base_extra, argv, needle", [
    ({"compile": False}, {}, ["--compile"], "has compile=False, this run True"),
    ({"compile": True}, {"compiled_autograd": False}, ["--compile", "--ddp-optimizer", "python_reducer"],
     "did not run under Compiled Autograd and this run does"),
    ({"compile": True}, {"compiled_autograd": True}, ["--compile"], "ran under Compiled Autograd and this run does not"),
])
def test_baseline_must_be_the_same_program(capsys, tmp_path, base_cfg, base_extra, argv, needle):
    base = tmp_path / "one.json"
    base.write_text(json.dumps({"world_size": 1, "total_tokens_per_s": 1.0, **base_extra,
                                "config": {"preset": "gpt2-tiny", "batch_per_device": 16, "seq": 1024, "grad_accum": 1,
                                           **base_cfg}}))
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--baseline", str(base), *argv])
    _one_line_error(capsys, rc, needle)


@pytest.mark.parametrize("base_extra, launch_env, needle", [
    # a plain 1-GPU run under an FSDP launch: FSDP computes on bf16 weights (109.6% "efficiency" on two H200s)
    ({"distributed_type": "MULTI_GPU"}, {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, "ran as DDP, this launch is FSDP2"),
    ({"distributed_type": "FSDP", "fsdp_version": 1}, {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
     "ran as FSDP1, this launch is FSDP2"),
    ({"distributed_type": "DEEPSPEED", "sharding_strategy": "DeepSpeed ZeRO-3"},
     {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}, "ran as DeepSpeed ZeRO-3, this launch is DeepSpeed ZeRO-2"),
    ({"distributed_type": "FSDP", "fsdp_version": 2}, {}, "ran as FSDP2, this launch is DDP"),
])
def test_baseline_must_be_the_same_wrapper(monkeypatch, capsys, tmp_path, base_extra, launch_env, needle):
    for k, v in launch_env.items():
        monkeypatch.setenv(k, v)
    base = tmp_path / "one.json"
    base.write_text(json.dumps({"world_size": 1, "total_tokens_per_s": 1.0, **base_extra,
                                "config": {"preset": "gpt2-tiny", "batch_per_device": 16, "seq": 1024, "grad_accum": 1}}))
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--baseline", str(base)])
    _one_line_error(capsys, rc, needle)


def test_noop_hook_runs_ddp_without_communication(tmp_path):
    """--comm-hook noop (PyTorch's headroom hook) on two gloo processes: DDP's reducer runs, no
    gradient crosses, so the ranks, each on its own shard, end with different weights."""
    out = tmp_path / "noop.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*LAUNCH, "--config_file", str(CONFIGS / "ddp.yaml"), "--num_processes", "2",
           "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
           str(SCRIPT), "--out", str(out), "--preset", "gpt2-tiny", "--batch-per-device", "2", "--seq", "32",
           "--steps", "2", "--warmup", "1", "--comm-hook", "noop", "--measure-comm"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["ddp"]["comm_hook"] != "none" and "noop" in r["ddp"]["comm_hook"]  # read back from DDP itself
    assert r["replicas_identical"] is False and r["gradients_synchronised"] is False
    assert "without any communication" in r["exposed_comm_note"]
    # the first step ran before any update: each rank's loss is its own shard's (they differ)
    assert r["per_rank"][0]["loss_per_step"][0] != r["per_rank"][1]["loss_per_step"][0]


FSDP2_LAUNCH = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}


@pytest.mark.parametrize("flags, env, needle", [
    (["--comm-hook", "noop"], {"WORLD_SIZE": "1"}, "needs DDP with 2+ processes"),
    (["--comm-hook", "noop"], FSDP2_LAUNCH, "is a DDP option"),
    (["--ddp-one-process"], {"WORLD_SIZE": "2"}, "wraps a single process"),
    (["--ddp-one-process"], FSDP2_LAUNCH, "wraps a single process")])
def test_ddp_headroom_modes_refuse_the_wrong_launch(monkeypatch, capsys, tmp_path, flags, env, needle):
    """The noop hook needs DDP with 2+ processes (or --ddp-one-process); DDP on one process
    needs one plain process."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(checks, "cpu_run", lambda: False)
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", *flags])
    _one_line_error(capsys, rc, needle)


def test_ddp_one_process_runs_ddp_over_a_one_rank_group(tmp_path):
    """--ddp-one-process: PyTorch's DDP around one gloo process, with the run's bucket and hook
    settings read back from DDP itself. With the default hook the all-reduce over one rank
    leaves the gradients as they are, so the losses match a plain run step by step."""
    common = [sys.executable, str(SCRIPT), "--preset", "gpt2-tiny", "--batch-per-device", "2", "--seq", "32",
              "--steps", "3", "--warmup", "1", "--bucket-mb", "1", "--bucket-view"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outs = {}
    for name, extra in (("plain", []), ("ddp", ["--ddp-one-process", "--measure-comm"]),
                        ("noop", ["--ddp-one-process", "--comm-hook", "noop"])):
        outs[name] = tmp_path / f"{name}.json"
        p = subprocess.run([*common, "--out", str(outs[name]), *extra], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
    plain, ddp, noop = (json.loads(outs[n].read_text()) for n in ("plain", "ddp", "noop"))
    assert plain["sharding_strategy"] == "none (one process, no wrapper)" and "ddp" not in plain
    assert ddp["world_size"] == 1 and ddp["sharding_strategy"] == "DDP (one process)" and ddp["ddp_one_process"]
    assert ddp["ddp"] == {"bucket_cap_mb": 1.0, "comm_hook": "none", "gradient_as_bucket_view": True}
    assert "noop" in noop["ddp"]["comm_hook"]
    assert ddp["per_rank"][0]["loss_per_step"] == pytest.approx(plain["per_rank"][0]["loss_per_step"], rel=1e-5)
    assert "nosync_median_ms" in ddp["per_rank"][0] and ddp["exposed_comm_share"] >= 0.0
    assert "gradients_synchronised" not in noop  # one process: nothing to drift from


def test_ddp_one_process_no_sync_is_ddps_own():
    """Accelerate's no_sync does nothing on one process; the wrapper's own turns the sync off."""
    import types

    import torch

    ddp = torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel)
    torch.nn.Module.__init__(ddp)
    ddp.require_backward_grad_sync = True
    with wrap.no_sync(types.SimpleNamespace(), ddp):  # Accelerate's would do nothing on one process
        assert ddp.require_backward_grad_sync is False
    assert ddp.require_backward_grad_sync is True


def test_ddp_one_process_result_is_not_a_baseline(capsys, tmp_path):
    base = tmp_path / "ddp1.json"
    base.write_text(json.dumps({"world_size": 1, "total_tokens_per_s": 1.0, "ddp_one_process": True,
                                "distributed_type": "NO", "config": {"preset": "gpt2-tiny", "batch_per_device": 16,
                                                                      "seq": 1024, "grad_accum": 1}}))
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--baseline", str(base)])
    _one_line_error(capsys, rc, "ran as DDP, one process")


def test_launch_family_names_what_scaling_names():
    """The launch's wrapper, from accelerate launch's environment, in utils.parallel.scaling's names."""
    from utils.parallel.scaling import wrapper_family

    assert checks.launch_family({}) == wrapper_family({"distributed_type": "MULTI_GPU"}) == "DDP"
    assert checks.launch_family({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}) == \
        wrapper_family({"distributed_type": "FSDP", "fsdp_version": 2}) == "FSDP2"
    assert checks.launch_family({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"}) == \
        wrapper_family({"distributed_type": "DEEPSPEED", "sharding_strategy": "DeepSpeed ZeRO-1"}) == "DeepSpeed ZeRO-1"


def test_comm_reorder_refused_on_a_torch_without_the_passes(monkeypatch, capsys, tmp_path):
    import torch._inductor.comms as comms

    monkeypatch.delattr(comms, "sink_waits_iterative")  # as on a torch from before the pass
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--compile",
                   "--ddp-optimizer", "python_reducer", "--comm-reorder"])
    _one_line_error(capsys, rc, "no Inductor pass sink_waits_iterative; drop --comm-reorder passes")


def test_overlap_scheduler_refused_on_a_torch_without_it(monkeypatch, capsys, tmp_path):
    import torch._inductor.config as inductor_config

    monkeypatch.delattr(inductor_config.aten_distributed_optimizations, "enable_overlap_scheduling")
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--compile",
                   "--ddp-optimizer", "python_reducer", "--comm-reorder", "overlap"])
    _one_line_error(capsys, rc, "no Inductor setting aten_distributed_optimizations.enable_overlap_scheduling")


def test_overlap_scheduler_refused_on_a_cpu(capsys, tmp_path):
    """It estimates kernel times through Triton's GPU driver: on gloo it failed deep inside Inductor."""
    rc = tmg.main(["--out", str(tmp_path / "x.json"), "--preset", "gpt2-tiny", "--compile",
                   "--ddp-optimizer", "python_reducer", "--comm-reorder", "overlap"])
    _one_line_error(capsys, rc, "--comm-reorder overlap needs CUDA GPUs")


def test_missing_out_folder(capsys, tmp_path):
    _one_line_error(capsys, tmg.main(["--out", str(tmp_path / "no" / "x.json")]), "does not exist")


def test_bad_baseline(capsys, tmp_path):
    two = tmp_path / "two.json"
    two.write_text(json.dumps({"world_size": 2, "total_tokens_per_s": 1.0}))
    _one_line_error(capsys, tmg.main(["--out", str(tmp_path / "x.json"), "--baseline", str(two)]), "world_size 2")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"world_size": 1, "config": {"preset": "gpt2-small", "batch_per_device": 8}}))
    _one_line_error(capsys, tmg.main(["--out", str(tmp_path / "x.json"), "--baseline", str(other)]), "batch_per_device")


def test_lab02_fsdp_cell_script_needs_gpus(capsys, tmp_path):
    """benchmarks/lab02_fsdp_cell.py (the lab's FSDP cell outside the notebook) says in one line
    that FSDP needs CUDA GPUs, instead of failing inside its first launch."""
    cell = load_script(ROOT / "benchmarks" / "lab02_fsdp_cell.py")
    rc = cell.main(["--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "FSDP needs CUDA GPUs" in err


def test_every_run_gpu_line_parses_and_validates(tmp_path):
    """benchmarks/run_gpu.sh holds GPU runs prepared for machines not always lent: each of its
    train_multi_gpu.py lines (written out, through ``$t`` or through its ``al`` helper) must get
    past the argument checks here, baseline files aside."""
    import re
    import shlex

    shell_vars = {"out": str(tmp_path), "n": "2", "k": "2", "b": "50", "c": "4", "z": "1", "v": "fsdp",
                  "a": "--batch-per-device 4 --grad-accum 4 --steps 20"}

    def expand(tokens: list[str]) -> list[str]:
        out = []
        for tok in tokens:
            if tok in (";", ";;", "&", "&&"):
                continue
            val = re.sub(r"\$\{?(\w+)\}?", lambda m: shell_vars[m.group(1)], tok)
            out += val.split() if re.fullmatch(r"\$\{?\w+\}?", tok) else [val]
        return out

    runs = []
    for ln in (ROOT / "benchmarks" / "run_gpu.sh").read_text().splitlines():
        code = ln.split(" #")[0].strip()
        if code.startswith("#") or '"$@"' in code or "--out" not in code:
            continue
        if "train_multi_gpu.py " in code:
            runs.append(expand(shlex.split(code.split("train_multi_gpu.py ", 1)[1])))
        elif " $t " in code:
            runs.append(expand(shlex.split(code.split(" $t ", 1)[1])))
        elif code.startswith("al "):
            runs.append(["--bf16", *expand(shlex.split(code))[2:]])
    assert len(runs) >= 30
    for argv in runs:
        if "--baseline" in argv:  # written by an earlier line of the same mode
            i = argv.index("--baseline")
            del argv[i:i + 2]
        args = tmg.parse_args(argv)
        assert checks.validate(args) is None, argv
