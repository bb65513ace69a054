"""utils.parallel.scaling and benchmarks/scaling_chart.py: curves from recorded runs, shipped and made up."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.procs import load_script
from utils.parallel import scaling

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RECORDED = RESULTS / "h200x2-phase2-lab02-and-compiled-buckets"
RECORDED_S4 = RESULTS / "h200x2-phase2-bf16-hook-fsdp2-scaling"
RECORDED_S5 = [RESULTS / r for r in ("h200x2-phase2-compile-modes-fsdp-baselines", "h200x2-phase2-nccl-cta-caps")]
RECORDED_S6 = [RESULTS / r for r in ("h200x2-phase2-buckets-inductor-schedulers", "h200x2-phase2-deepspeed-zero")]
RECORDED_S8 = RESULTS / "h200-phase2-ddp-one-process"  # one H200, --ddp-one-process
chart = load_script(ROOT / "benchmarks" / "scaling_chart.py")


def train(world: int, tps: float, *, strategy: str = "DDP (replicated)", dist: str = "MULTI_GPU", compile_: bool = False,
          batch: int = 16, base: float | None = None, comm: float | None = None, env: dict | None = None, **cfg) -> dict:
    d = {"world_size": world, "distributed_type": dist if world > 1 else "MULTI_GPU",
         "sharding_strategy": strategy if world > 1 else "none (one process, no wrapper)", "tokens_per_s_per_device": tps,
         "config": {"preset": "gpt2-small", "batch_per_device": batch, "seq": 1024, "bf16": True, "compile": compile_,
                    "grad_accum": 1, "bucket_mb": 25, "bucket_view": False, **cfg}, "env": env or {}}
    if base is not None:
        d["baseline"] = {"file": "/elsewhere/one.json", "tokens_per_s": base}
    if comm is not None:
        d["exposed_comm_share"] = comm
    return d


def write(folder: Path, **runs: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in runs.items():
        (folder / f"{name}.json").write_text(json.dumps(data))
    return folder


def by_label(curves):
    return {c.label: c for c in curves}


def test_curves_group_runs_and_start_at_the_one_gpu_run(tmp_path):
    d = write(tmp_path / "study", one=train(1, 100.0), ddp2=train(2, 98.0, comm=0.02), ddp4=train(4, 90.0, comm=0.06),
              fsdp_one=dict(train(1, 100.0), distributed_type="FSDP", sharding_strategy="NO_SHARD", fsdp_version=1),
              fsdp2=train(2, 80.0, strategy="FULL_SHARD", dist="FSDP"),
              fully_shard_one=dict(train(1, 110.0), distributed_type="FSDP", sharding_strategy="FULL_SHARD",
                                   fsdp_version=2),
              fully_shard=dict(train(2, 85.0, strategy="FULL_SHARD", dist="FSDP"), fsdp_version=2),
              p2p=train(2, 93.0, env={"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": None}),
              big=train(2, 99.0, bucket_mb=200, bucket_view=True, comm_hook="bf16"),
              noopt=train(2, 97.0, compile_=True, ddp_optimizer="no_optimization"),
              reorder=train(2, 96.0, compile_=True, ddp_optimizer="python_reducer", comm_reorder=True),
              overlap=train(2, 96.5, compile_=True, ddp_optimizer="python_reducer", comm_reorder="overlap"),
              notes={"something": "else"})  # other JSONs are skipped
    c = by_label(scaling.training_curves([d]))
    assert set(c) == {"eager DDP", "eager FSDP FULL_SHARD", "eager FSDP2 FULL_SHARD", "eager DDP, NCCL_P2P_DISABLE=1",
                      "eager DDP, 200 MB buckets, bucket views, bf16 hook", "compiled DDP, optimize_ddp=no_optimization",
                      "compiled DDP, optimize_ddp=python_reducer, comm reorder",
                      "compiled DDP, optimize_ddp=python_reducer, overlap scheduler"}
    assert c["eager DDP"].per_device == {1: 100.0, 2: 98.0, 4: 90.0}
    assert c["eager DDP"].efficiency() == {1: 1.0, 2: 0.98, 4: 0.9}
    assert c["eager DDP"].exposed_comm == {2: 0.02, 4: 0.06}
    assert c["eager FSDP FULL_SHARD"].efficiency()[2] == 0.8
    # each FSDP version scales from itself on one process, not from the plain 1-GPU run
    assert c["eager FSDP2 FULL_SHARD"].per_device == {1: 110.0, 2: 85.0}
    table = scaling.markdown_table(scaling.training_curves([d]))
    assert "| study | eager DDP" not in table and "| study | gpt2-small, batch 16 x 1024, bf16 | eager DDP | 4 | 90 | 90.0% | 6.0% |" in table


def test_the_runs_own_baseline_wins_and_studies_stay_apart(tmp_path):
    a = write(tmp_path / "a", one=train(1, 100.0), two=train(2, 95.0, base=120.0))
    b = write(tmp_path / "b", one=train(1, 200.0), two=train(2, 190.0))
    curves = scaling.training_curves([a, b])
    assert [(c.source, c.per_device) for c in curves] == [("a", {2: 95.0, 1: 120.0}), ("a", {1: 100.0}),
                                                          ("b", {2: 190.0, 1: 200.0})]
    assert curves[1].label == "eager, 1 GPU"  # a's own 1-GPU run: the 2-GPU run was measured against another


def test_compiled_autograd_and_cta_caps_start_their_own_curves(tmp_path):
    """A Compiled Autograd run on one GPU is another program (13% faster on an H200): its 2-GPU
    runs scale from it, not from the plain compiled run; an NCCL CTA cap is part of the label."""
    d = write(tmp_path / "s", one=train(1, 100.0, compile_=True),
              ca_one=dict(train(1, 113.0, compile_=True, ddp_optimizer="python_reducer"), compiled_autograd=True),
              ca_two=dict(train(2, 105.0, compile_=True, ddp_optimizer="python_reducer"), compiled_autograd=True),
              plain_two=train(2, 95.0, compile_=True), capped=train(2, 91.0, compile_=True, env={"NCCL_MAX_CTAS": "4"}),
              urgent=train(2, 96.0, compile_=True, env={"TORCH_NCCL_HIGH_PRIORITY": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}),
              one_queue=train(2, 96.5, compile_=True, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}))
    c = by_label(scaling.training_curves([d]))
    assert set(c) == {"compiled DDP", "compiled DDP, optimize_ddp=python_reducer", "compiled DDP, NCCL_MAX_CTAS=4",
                      "compiled DDP, TORCH_NCCL_HIGH_PRIORITY=1", "compiled DDP, CUDA_DEVICE_MAX_CONNECTIONS=1"}
    assert c["compiled DDP, optimize_ddp=python_reducer"].per_device == {2: 105.0, 1: 113.0}
    assert c["compiled DDP"].per_device[1] == c["compiled DDP, NCCL_MAX_CTAS=4"].per_device[1] == 100.0
    lone = by_label(scaling.training_curves([write(tmp_path / "t", ca=dict(train(1, 113.0, compile_=True),
                                                                             compiled_autograd=True))]))
    assert set(lone) == {"compiled, Compiled Autograd, 1 GPU"}


def test_loss_scope_runs_start_their_own_curves(tmp_path):
    """--compile-scope loss is another program on one GPU too (366k against 324k tokens/s on an
    H200): its 2-GPU run scales from the loss-scope 1-GPU run, and a lone one is labelled."""
    d = write(tmp_path / "s", one=train(1, 100.0, compile_=True, compile_scope="model"),
              scope_one=train(1, 113.0, compile_=True, compile_scope="loss"),
              scope_two=train(2, 108.0, compile_=True, compile_scope="loss", env={"NCCL_CTA_POLICY": "1"}),
              plain_two=train(2, 95.0, compile_=True, compile_scope="model"),
              noop_two=train(2, 99.0, compile_=True, compile_scope="model", comm_hook="noop"))
    c = by_label(scaling.training_curves([d]))
    assert set(c) == {"compiled DDP", "compiled DDP, loss scope, NCCL_CTA_POLICY=1",
                      "compiled DDP, noop hook (no communication)"}
    assert c["compiled DDP, noop hook (no communication)"].per_device == {1: 100.0, 2: 99.0}
    assert c["compiled DDP, loss scope, NCCL_CTA_POLICY=1"].per_device == {1: 113.0, 2: 108.0}
    assert c["compiled DDP"].per_device == {1: 100.0, 2: 95.0}
    lone = by_label(scaling.training_curves([write(tmp_path / "t", x=train(1, 113.0, compile_=True, compile_scope="loss"))]))
    assert set(lone) == {"compiled, loss scope, 1 GPU"}


def test_ddp_on_one_process_is_a_point_of_its_own(tmp_path):
    """A --ddp-one-process run is world_size 1 but not a base: the plain run still starts the
    2-GPU curve, and the DDP one stands alone, labelled with its DDP settings."""
    ddp_one = dict(train(1, 97.0, compile_=True, bucket_mb=100, bucket_view=True, comm_hook="noop"),
                   sharding_strategy="DDP (one process)", distributed_type="NO", ddp_one_process=True,
                   exposed_comm_share=0.01)
    d = write(tmp_path / "s", one=train(1, 100.0, compile_=True), ddp_one=ddp_one,
              ddp_one_again=dict(ddp_one, tokens_per_s_per_device=96.0),
              two=train(2, 95.0, compile_=True, bucket_mb=100, bucket_view=True))
    c = by_label(scaling.training_curves([d]))
    assert c["compiled DDP, 100 MB buckets, bucket views"].per_device == {1: 100.0, 2: 95.0}
    label = "compiled DDP, 100 MB buckets, bucket views, noop hook (no communication), one process (no link)"
    assert c[label].per_device == {1: 97.0} and c[label].exposed_comm == {1: 0.01}
    assert c[f"{label} [ddp_one_again]"].per_device == {1: 96.0}  # a look-alike is kept, not overwritten
    assert scaling.wrapper_family(ddp_one) == "DDP, one process"


def test_repeated_one_gpu_runs_are_all_kept(tmp_path):
    """Two 1-GPU runs of one program in a folder (a repeat to see the spread): the 2-GPU curve
    starts at the last by file name, and the other stays a point of its own."""
    d = write(tmp_path / "s", plain_a=train(1, 100.0, compile_=True), plain_b=train(1, 101.0, compile_=True),
              solo_a=train(1, 50.0), solo_b=train(1, 51.0), two=train(2, 95.0, compile_=True))
    c = by_label(scaling.training_curves([d]))
    assert c["compiled DDP"].per_device == {1: 101.0, 2: 95.0}
    assert c["compiled, 1 GPU"].per_device == {1: 100.0}
    assert c["eager, 1 GPU"].per_device == {1: 50.0} and c["eager, 1 GPU [solo_b]"].per_device == {1: 51.0}


def test_look_alike_runs_are_both_kept(tmp_path):
    d = write(tmp_path / "s", one=train(1, 100.0), fsdp_a=train(2, 50.0, strategy="FULL_SHARD", dist="FSDP"),
              fsdp_b=train(2, 55.0, strategy="FULL_SHARD", dist="FSDP"))
    curves = scaling.training_curves([d])
    assert sorted(c.per_device[2] for c in curves if 2 in c.per_device) == [50.0, 55.0]
    # no FSDP run on one process here: the plain one is not borrowed, it stays a point of its own
    assert [c.label for c in curves if 2 not in c.per_device] == ["eager, 1 GPU"]


@pytest.mark.parametrize("study", [RECORDED, RECORDED_S4, *RECORDED_S5, *RECORDED_S6], ids=lambda p: p.name)
def test_shipped_h200_runs_agree_with_their_own_efficiency(study):
    """The recorded 2 x H200 studies: efficiency recomputed here equals what train_multi_gpu.py wrote."""
    curves = scaling.training_curves([study])
    assert curves and all(c.source == study.name for c in curves)
    for c in curves:
        for n, f in c.files.items():
            if n > min(c.files):  # a curve's first point is its own base (s6's eager run has no 1-GPU run)
                own = json.loads(Path(f).read_text())["scaling_efficiency"]
                assert c.efficiency()[n] == pytest.approx(own, rel=1e-12)


@pytest.mark.parametrize("call", ["call1", "call2"])
def test_shipped_ddp_one_process_runs(call):
    """The recorded --ddp-one-process runs (RECORDED_S8) on one H200: each names a plain run of its own
    call as baseline, its efficiency is its tokens/s over that run's, DDP ran the buckets the
    config asked for, and each stands as a point of its own."""
    folder = RECORDED_S8 / call
    ddp_one = []
    for f in sorted(folder.glob("*.json")):
        d = json.loads(f.read_text())
        if not d.get("ddp_one_process"):
            continue
        ddp_one.append(d)
        base = json.loads((folder / Path(d["baseline"]["file"]).name).read_text())
        assert scaling.wrapper_family(base) == "DDP" and not base.get("ddp_one_process")
        assert base["config"]["compile_scope"] == d["config"]["compile_scope"]
        assert base["compiled_autograd"] == d["compiled_autograd"]
        assert d["scaling_efficiency"] == pytest.approx(d["tokens_per_s_per_device"] / base["tokens_per_s_per_device"])
        assert d["ddp"]["bucket_cap_mb"] == d["config"]["bucket_mb"]
        assert d["ddp"]["gradient_as_bucket_view"] == d["config"]["bucket_view"]
    lone = [c for c in scaling.training_curves([folder]) if c.label.endswith("one process (no link)")
            or "one process (no link) [" in c.label]
    assert len(ddp_one) >= 4 and len(lone) == len(ddp_one)


def test_deepspeed_runs_make_their_own_curve(tmp_path):
    """A ZeRO stage on one GPU and on two: one curve, labelled by the stage the engine reported."""
    zero = {"strategy": "DeepSpeed ZeRO-2", "dist": "DEEPSPEED"}
    d = write(tmp_path / "ds", one=dict(train(1, 100.0), distributed_type="DEEPSPEED", sharding_strategy="DeepSpeed ZeRO-2"),
              two=train(2, 95.0, **zero), ddp=train(2, 98.0))
    c = by_label(scaling.training_curves([d]))
    assert c["eager DeepSpeed ZeRO-2"].efficiency() == {1: 1.0, 2: 0.95}
    assert c["eager DDP"].per_device == {2: 98.0}  # the ZeRO run on one GPU is not its base


def test_allreduce_rows_and_bad_files(tmp_path):
    ar = {"benchmark": "allreduce", "world_size": 2, "backend": "nccl", "env": {"NCCL_P2P_DISABLE": "1"},
          "results": [{"bytes": 2**30, "busbw_gbs": 27.2}, {"bytes": 2**20, "busbw_gbs": 15.9}]}
    d = write(tmp_path / "s", ar=ar)
    assert scaling.allreduce_curves([d]) == {"2 ranks, nccl, NCCL_P2P_DISABLE=1": [(2**20, 15.9), (2**30, 27.2)]}
    write(d, broken={**ar, "results": [{"bytes": 1}]})
    with pytest.raises(scaling.ScalingDataError, match="broken.json: all-reduce rows without"):
        scaling.allreduce_curves([d])
    bad = write(tmp_path / "bad", one=train(1, None), two=train(2, -1.0))
    with pytest.raises(scaling.ScalingDataError, match="one.json: a train_multi_gpu.py result with a malformed field"):
        scaling.training_curves([bad / "one.json"])
    with pytest.raises(scaling.ScalingDataError, match="two.json: .* are not a measured run"):
        scaling.training_curves([bad / "two.json"])
    (d / "garbled.json").write_text("{not json")
    with pytest.raises(scaling.ScalingDataError, match="garbled.json: not JSON"):
        scaling.training_curves([d])


def test_chart_cli(tmp_path, capsys):
    png = tmp_path / "s.png"
    assert chart.main([str(RECORDED), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "compiled DDP, 200 MB buckets, bucket views | 2 | 308,804 | 95.2% | 4.2% |" in out and png.stat().st_size > 0
    for args, needle in (([str(tmp_path / "nope")], "no such file or folder"),
                         ([str(tmp_path)], "no train_multi_gpu.py or allreduce.py results"),
                         ([str(RECORDED), "--png", str(tmp_path / "no" / "x.png")], "no folder"),
                         ([str(RECORDED), "--png", str(tmp_path / "x.nosuchformat")], "cannot write")):
        assert chart.main(args) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, err
