"""Scaling curves from recorded runs: ``benchmarks/train_multi_gpu.py`` and ``allreduce.py`` JSONs.

A scaling study is many launches (1, 2, 4, 8 GPUs; DDP and FSDP; eager and compiled), each
writing its own JSON. This module groups them into curves: one per way of training (strategy,
compile, DDP's bucket knobs, an NCCL transport override) and per shape (preset, batch per
device, sequence, accumulation), each curve holding tokens/s per device by GPU count. The
one-process run of a shape has no strategy (nothing wraps the model), so it starts every curve of
that shape. Efficiency is :func:`utils.parallel.distributed.scaling_efficiency` against that point, the
definition ``train_multi_gpu.py --baseline`` uses.

    python benchmarks/scaling_chart.py benchmarks/results/<run>/ --png scaling.png   # table + chart
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from utils.parallel.distributed import scaling_efficiency

# NCCL settings a run overrode: transports forced off, the SMs (CTAs) a collective takes, and
# PyTorch's high-priority stream for NCCL (TORCH_NCCL_HIGH_PRIORITY, ProcessGroupNCCL.hpp)
NCCL_OVERRIDES = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS",
                  "NCCL_CTA_POLICY", "TORCH_NCCL_HIGH_PRIORITY", "CUDA_DEVICE_MAX_CONNECTIONS")


class ScalingDataError(ValueError):
    """A file that is not a result of train_multi_gpu.py or allreduce.py, or is malformed."""


@dataclass
class Curve:
    """Tokens/s per device by GPU count for one way of training one shape."""
    label: str
    shape: str
    per_device: dict[int, float] = field(default_factory=dict)
    exposed_comm: dict[int, float] = field(default_factory=dict)
    files: dict[int, str] = field(default_factory=dict)
    source: str = ""  # the folder (one study) the runs came from

    def efficiency(self) -> dict[int, float]:
        """Per-device throughput at each count over that at the curve's smallest count (1 GPU when
        the curve has it)."""
        if not self.per_device:
            return {}
        base = self.per_device[min(self.per_device)]
        return {n: scaling_efficiency(v, base, n, per_device=True) for n, v in sorted(self.per_device.items())}


def _read(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ScalingDataError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ScalingDataError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ScalingDataError(f"{path}: not a result object")
    return data


def _files(paths) -> list[Path]:
    out: list[Path] = []
    for p in (Path(x) for x in paths):
        if p.is_dir():
            out += sorted(p.glob("*.json"))
        elif p.is_file():
            out.append(p)
        else:
            raise ScalingDataError(f"{p}: no such file or folder")
    return out


def kind(data: dict) -> str | None:
    """``"train"`` for a train_multi_gpu.py result, ``"allreduce"`` for allreduce.py's, else None."""
    if data.get("benchmark") == "allreduce" or ("results" in data and "world_size" in data and "backend" in data):
        return "allreduce"
    if "tokens_per_s_per_device" in data and isinstance(data.get("config"), dict) and "world_size" in data:
        return "train"
    return None


def _shape(cfg: dict) -> str:
    s = f"{cfg.get('preset')}, batch {cfg.get('batch_per_device')} x {cfg.get('seq')}"
    if cfg.get("grad_accum", 1) != 1:
        s += f" x {cfg['grad_accum']} micro-batches"
    return s + (", bf16" if cfg.get("bf16") else ", fp32")


def _way(data: dict) -> str:
    cfg = data["config"]
    strat = str(data.get("sharding_strategy", "?"))
    fsdp = "FSDP2" if data.get("fsdp_version") == 2 else "FSDP"
    strat = "DDP" if strat.startswith("DDP") else f"{fsdp} {strat}" if data.get("distributed_type") == "FSDP" else strat
    parts = [("compiled " if cfg.get("compile") else "eager ") + strat]
    if _loss_scope(data):
        parts.append("loss scope")
    if strat == "DDP":
        if cfg.get("bucket_mb", 25) != 25:
            parts.append(f"{cfg['bucket_mb']} MB buckets")
        if cfg.get("bucket_view"):
            parts.append("bucket views")
        if cfg.get("comm_hook", "none") == "noop":
            parts.append("noop hook (no communication)")
        elif cfg.get("comm_hook", "none") != "none":
            parts.append(f"{cfg['comm_hook']} hook")
        if cfg.get("ddp_optimizer", "ddp_optimizer") != "ddp_optimizer":
            parts.append(f"optimize_ddp={cfg['ddp_optimizer']}")
        reorder = cfg.get("comm_reorder")  # True in JSON written before the overlap scheduler was an option
        if reorder:
            parts.append("overlap scheduler" if reorder == "overlap" else "comm reorder")
        if cfg.get("no_sync_accum"):
            parts.append("all-reduce every micro-batch")
    parts += _overrides(data)
    return ", ".join(parts)


def _overrides(data: dict) -> list[str]:
    env = data.get("env") or {}
    return [f"{k}={env[k]}" for k in NCCL_OVERRIDES if env.get(k) not in (None, "")]


def _loss_scope(data: dict) -> bool:
    """A run compiled with ``--compile-scope loss`` (only the loss leaves the graph): on one H200
    that alone made the step 13% faster (RESULTS.md), so it starts its own curves."""
    return data["config"].get("compile_scope") == "loss"


def _compiled_autograd(data: dict) -> bool:
    """A run whose backward Compiled Autograd traced (``--ddp-optimizer python_reducer``): on one
    GPU it is another program than a plain compiled run, so it starts its own curves."""
    return bool(data.get("compiled_autograd")) or data["config"].get("ddp_optimizer") == "python_reducer"


def wrapper_family(data: dict) -> str:
    """Which wrapper ran a ``train_multi_gpu.py`` result: ``"DDP"`` (a plain 1-GPU run is the
    base of DDP), ``"FSDP1"``/``"FSDP2"`` or ``"DeepSpeed ZeRO-N"``. FSDP and each ZeRO stage are
    compared with themselves on one GPU: under bf16 their one-process runs compute on bf16
    weights, unlike a plain autocast run (eager FSDP2 scored 109.6% against one, RESULTS.md).
    ``"DDP, one process"`` is ``--ddp-one-process``: DDP's machinery with no link, measured
    against the plain run, never a base itself."""
    if data.get("ddp_one_process"):
        return "DDP, one process"
    dist = str(data.get("distributed_type"))
    if dist == "FSDP":
        return f"FSDP{data.get('fsdp_version') or 1}"
    if dist == "DEEPSPEED":
        return str(data.get("sharding_strategy", "DeepSpeed"))
    return "DDP"


def _base_key(data: dict) -> tuple:
    """What a run must share with a one-process run of its folder to scale from it."""
    return (data["_source"], _shape(data["config"]), bool(data["config"].get("compile")), _compiled_autograd(data),
            wrapper_family(data), _loss_scope(data))


def _free_label(curves: dict, src: str, shape: str, way: str, file: str) -> str:
    """``way``, or ``way [file stem]`` when a look-alike run of the study already holds it."""
    return f"{way} [{Path(file).stem}]" if (src, shape, way) in curves else way


def training_curves(paths) -> list[Curve]:
    """Curves from train_multi_gpu.py results among ``paths`` (files or folders; other JSONs
    skipped). Each folder is one study: curves of different folders are kept apart. A curve's
    1-GPU point is the baseline its runs were measured against (``--baseline``), else the
    folder's one-process run of the same shape, compile setting, autograd (plain or Compiled
    Autograd) and wrapper family (:func:`wrapper_family`). A ``--ddp-one-process`` run is a point
    of its own, labelled with its DDP settings: it starts no curve."""
    singles: dict[tuple, list[dict]] = {}  # a folder may hold several 1-GPU runs of one program
    multi: list[dict] = []
    lone: list[dict] = []
    for f in _files(paths):
        data = _read(f)
        if kind(data) != "train":
            continue
        data["_file"], data["_source"] = str(f), f.parent.name
        try:
            data["world_size"] = int(data["world_size"])
            data["tokens_per_s_per_device"] = float(data["tokens_per_s_per_device"])
            if data.get("exposed_comm_share") is not None:
                data["exposed_comm_share"] = float(data["exposed_comm_share"])
            base = data.get("baseline")
            if base is not None and base.get("tokens_per_s") is not None:
                base["tokens_per_s"] = float(base["tokens_per_s"])
        except (TypeError, ValueError, AttributeError) as exc:
            raise ScalingDataError(f"{f}: a train_multi_gpu.py result with a malformed field ({exc})") from None
        if data["world_size"] < 1 or not data["tokens_per_s_per_device"] > 0:
            raise ScalingDataError(f"{f}: world_size {data['world_size']} and tokens/s per device "
                                   f"{data['tokens_per_s_per_device']} are not a measured run")
        if data.get("ddp_one_process"):
            lone.append(data)
        elif data["world_size"] == 1:
            singles.setdefault(_base_key(data), []).append(data)
        else:
            multi.append(data)
    curves: dict[tuple, Curve] = {}
    single_of: dict[tuple, tuple] = {}  # curve key -> the singles key of its 1-GPU run
    for data in multi:
        shape, way, src = _shape(data["config"]), _way(data), data["_source"]
        n = int(data["world_size"])
        c = curves.setdefault((src, shape, way), Curve(way, shape, source=src))
        if n in c.per_device:  # two runs that look alike (say, two configs that ran the same strategy): keep both
            way = f"{way} [{Path(data['_file']).stem}]"
            c = curves.setdefault((src, shape, way), Curve(way, shape, source=src))
        single_of[(src, shape, way)] = _base_key(data)
        c.per_device[n] = float(data["tokens_per_s_per_device"])
        c.files[n] = data["_file"]
        if data.get("exposed_comm_share") is not None:
            c.exposed_comm[n] = float(data["exposed_comm_share"])
        base = (data.get("baseline") or {}).get("tokens_per_s")
        if base is not None:
            c.per_device[1] = float(base)
            c.files[1] = str((data.get("baseline") or {}).get("file", "baseline"))
    for key, c in curves.items():
        one = (singles.get(single_of[key]) or [None])[-1]  # the folder's last one (files sort by name)
        if 1 not in c.per_device and one is not None:
            c.per_device[1] = float(one["tokens_per_s_per_device"])
            c.files[1] = one["_file"]
    for (src, shape, compiled, autograd, family, loss_scope), ones in singles.items():  # 1-GPU runs no curve uses
        for one in ones:
            used = {c.per_device.get(1) for c in curves.values() if c.source == src and c.shape == shape}
            if float(one["tokens_per_s_per_device"]) in used:
                continue
            way = ("compiled" if compiled else "eager") + ("" if family == "DDP" else f" {family}") + \
                (", Compiled Autograd" if autograd else "") + (", loss scope" if loss_scope else "") + ", 1 GPU"
            way = _free_label(curves, src, shape, way, one["_file"])  # a repeat of one program is kept
            curves[(src, shape, way)] = Curve(way, shape, {1: float(one["tokens_per_s_per_device"])}, {}, {1: one["_file"]},
                                              source=src)
    for data in lone:
        shape, src = _shape(data["config"]), data["_source"]
        way = _free_label(curves, src, shape, f"{_way(data)}, one process (no link)", data["_file"])
        curves[(src, shape, way)] = Curve(way, shape, {1: data["tokens_per_s_per_device"]}, {}, {1: data["_file"]},
                                          source=src)
        if data.get("exposed_comm_share") is not None:
            curves[(src, shape, way)].exposed_comm[1] = float(data["exposed_comm_share"])
    return sorted(curves.values(), key=lambda c: (c.source, c.shape, c.label))


def allreduce_curves(paths) -> dict[str, list[tuple[int, float]]]:
    """``{"2 ranks, nccl": [(bytes, busbw GB/s), ...]}`` from allreduce.py results among ``paths``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for f in _files(paths):
        data = _read(f)
        if kind(data) != "allreduce":
            continue
        label = ", ".join([f"{data['world_size']} ranks", str(data.get("backend", "?")), *_overrides(data)])
        try:
            rows = sorted((int(r["bytes"]), float(r["busbw_gbs"])) for r in data["results"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ScalingDataError(f"{f}: all-reduce rows without bytes/busbw_gbs ({exc})") from None
        out[label] = rows
    return out


def markdown_table(curves: list[Curve]) -> str:
    """One row per curve and GPU count: tokens/s per device, efficiency, exposed communication."""
    lines = ["| study | shape | run | GPUs | tokens/s per GPU | efficiency | exposed comm |", "|---|---|---|---|---|---|---|"]
    for c in curves:
        eff = c.efficiency()
        for n, v in sorted(c.per_device.items()):
            e = f"{100 * eff[n]:.1f}%" if n != min(c.per_device) else ""
            x = f"{100 * c.exposed_comm[n]:.1f}%" if n in c.exposed_comm else ""
            lines.append(f"| {c.source} | {c.shape} | {c.label} | {n} | {v:,.0f} | {e} | {x} |")
    return "\n".join(lines)


def figure(curves: list[Curve], allreduce: dict[str, list[tuple[int, float]]] | None = None, *,
           title: str | None = None) -> Any:
    """:func:`utils.plots.per_device_scaling` of these curves (and all-reduce rows, when given)."""
    from utils.plots import per_device_scaling

    studies = {c.source for c in curves}
    series = {f"{c.label} ({c.shape}" + (f"; {c.source}" if len(studies) > 1 else "") + ")": dict(c.per_device)
              for c in curves}
    return per_device_scaling(series, allreduce, title=title)
