"""Each lab's results as before/after tables, for ``python -m utils.portfolio``.

Every number comes from the record as ``grader/phase<N>_records.py``'s ``save_record``
writes it, printed with :func:`utils.portfolio_format.num`; nothing is computed from them
(a ratio the lab records, such as lab 01's ``speedup``, is shown; one it does not is not).
A table whose measurements the record lacks is left out, so a record written by an older or
newer notebook still renders (its every measurement is in the README's full list).
"""
from __future__ import annotations

from collections.abc import Callable

from utils.portfolio_format import get, md_table, num
from utils.record import Measurement, Record


def _val(m: Measurement | None) -> str:
    return f"{num(m.value)} {m.unit}" if m else "-"


def _placements(extra: dict, roofs: tuple[str, ...]) -> list[str]:
    """The kernel's placement on each roof: the record's ``placements`` dict (one entry per
    roof), or the single ``placement`` an older record holds."""
    pl = extra.get("placements")
    if roofs:
        return [num(pl.get(r)) if isinstance(pl, dict) else "-" for r in roofs]
    return [num(extra.get("placement"))]


def lab00(rec: Record) -> list[str]:
    ms = rec.measurements
    kernels = [(k, m) for k, m in ms.items() if m.unit in ("TFLOP/s", "GB/s")]
    out = []
    if kernels:
        out += ["### Kernels and where each sits on the roofline", ""]
        roofs = tuple(dict.fromkeys(r for _, m in kernels if isinstance(m.extra.get("placements"), dict)
                                    for r in m.extra["placements"]))
        out += md_table(["kernel", "achieved", "FLOPs", "bytes", "median (ms)",
                         *([f"placed ({r} roof)" for r in roofs] or ["placed"])],
                        [(k, _val(m), get(m.extra, "flops"), get(m.extra, "bytes"), get(m.extra, "median_ms"),
                          *_placements(m.extra, roofs)) for k, m in kernels])
        out.append("")
    tr, mfu = ms.get("train_tokens_per_s"), ms.get("train_mfu")
    if tr or mfu:
        ex = mfu.extra if mfu else {}
        out += ["### The training step", ""]
        out += md_table(["what", "value"], [
            ("throughput", _val(tr)), ("MFU (fraction of peak)", num(mfu.value) if mfu else "-"),
            ("achieved TFLOP/s in the step", ex.get("step_tflops")), ("peak TFLOP/s used for MFU", ex.get("peak_tflops")),
            ("step at full batch (ms)", ex.get("full_median_ms")), ("step at small batch (ms)", ex.get("small_median_ms")),
            ("batch scaling", ex.get("batch_scaling")), ("fixed share of the step", ex.get("fixed_share")),
            ("limiter", ex.get("limiter"))])
        out.append("")
    return out


def lab01(rec: Record) -> list[str]:
    ms = rec.measurements
    out = []
    base, opt, sp = ms.get("baseline_tokens_per_s"), ms.get("optimized_tokens_per_s"), ms.get("speedup")
    if base or opt:
        cfg = get(opt, "extra", "config") if opt else None
        out += ["### Baseline against optimized training loop", ""]
        out += md_table(["loop", "throughput", "speedup"],
                        [("naive (baseline)", _val(base), "-"), ("optimized", _val(opt), _val(sp))])
        if isinstance(cfg, dict):
            out += ["", "The optimized loop's settings: " + ", ".join(f"{k} {num(v)}" for k, v in cfg.items()) + "."]
        out.append("")
    ft = [(k.removesuffix("_peak_gib"), m) for k, m in ms.items() if k.endswith("_peak_gib")]
    if ft:
        out += ["### LoRA against QLoRA: peak memory", ""]
        out += md_table(["recipe", "peak", "weights (GiB)", "optimizer (GiB)", "activations (GiB)", "quantization",
                         "tokens/s", "how measured"],
                        [(k, _val(m), m.extra.get("weights_gib"), m.extra.get("optimizer_gib"),
                          m.extra.get("activations_gib"), m.extra.get("quant"), m.extra.get("tokens_per_s"), m.method)
                         for k, m in ft])
        out.append("")
    prof = ms.get("naive_profile_step_ms")
    if prof:
        out += ["### The naive loop, profiled", ""]
        out += md_table(["what", "value"], [("profiled step", _val(prof)), ("profiler's diagnosis", prof.extra.get("diagnosis")),
                                            ("bottleneck (yours)", prof.extra.get("bottleneck")),
                                            ("first fix (yours)", prof.extra.get("first_fix"))])
        out.append("")
    return out


def _run_row(label: str, run: dict) -> tuple:
    rank0 = get(run, "per_rank", 0, default={})
    return (label, get(run, "world_size"), get(run, "config", "batch_per_device"), get(run, "config", "grad_accum"),
            get(run, "total_tokens_per_s"), get(run, "tokens_per_s_per_device"), get(rank0, "median_ms"),
            get(run, "peak_allocated_gib_per_rank"), get(run, "exposed_comm_share", default="-"))


_RUN_HEADER = ["run", "GPUs", "batch per GPU", "grad accumulation", "tokens/s (all GPUs)", "tokens/s per GPU",
               "step, rank 0 (ms)", "peak allocated per rank (GiB)", "exposed communication (fraction)"]


def lab02(rec: Record) -> list[str]:
    ms = rec.measurements
    out = []
    eff = ms.get("scaling_efficiency")
    if eff and isinstance(eff.extra.get("one"), dict) and isinstance(eff.extra.get("many"), dict):
        out += ["### One GPU against all of them", ""]
        out += md_table(_RUN_HEADER, [_run_row("one GPU", eff.extra["one"]), _run_row("all GPUs", eff.extra["many"])])
        out += ["", f"Scaling efficiency (per-GPU tokens/s on all over one): {num(eff.value)}; backend "
                f"{num(eff.extra.get('backend'))}.", ""]
    comm = ms.get("exposed_comm_share")
    if comm:
        breaks = comm.extra.get("breaks") or {}
        if breaks:
            out += ["### Where scaling breaks", ""]
            out += md_table(_RUN_HEADER, [_run_row(k, v) for k, v in breaks.items() if isinstance(v, dict)])
            out.append("")
    bus = ms.get("busbw_gbs")
    if bus:
        out += ["### All-reduce bus bandwidth", ""]
        rows = [r for r in bus.extra.get("rows") or [] if isinstance(r, dict)]
        if rows:
            out += md_table(["message (bytes)", "ranks", "time (us)", "algorithm bandwidth (GB/s)",
                             "bus bandwidth (GB/s)", "fraction of the link"],
                            [(r.get("bytes"), r.get("n_ranks"), r.get("time_us"), r.get("algbw_gbs"), r.get("busbw_gbs"),
                              r.get("busbw_fraction_of_link", "-")) for r in rows])
        link = bus.extra.get("link")
        out += ["", f"Bus bandwidth of the largest message: {_val(bus)}"
                + (f"; the link as assumed: {num(get(link, 'name'))}, {num(get(link, 'per_direction_gbs'))} GB/s per "
                   f"direction ({num(get(link, 'note'))})" if isinstance(link, dict) else "") + ".", ""]
    return out


def _sorted_by(ms: dict, prefix: str, key: str) -> list[Measurement]:
    found = [m for k, m in ms.items() if k.startswith(prefix)]
    return sorted(found, key=lambda m: (not isinstance(m.extra.get(key), (int, float)), m.extra.get(key) or 0, m.name))


def lab03(rec: Record) -> list[str]:
    ms = rec.measurements
    out = []
    decode = [m for k, m in ms.items() if k.startswith("decode_")]
    if decode:
        out += ["### Decode at batch one, three ways", ""]
        out += md_table(["way", "tokens/s", "TPOT (ms)", "bytes read per step", "achieved GB/s", "fraction of copy GB/s"],
                        [(m.name.removeprefix("decode_"), m.value, m.extra.get("tpot_ms"), m.extra.get("bytes_per_step"),
                          m.extra.get("bandwidth_gbs"), m.extra.get("copy_fraction")) for m in decode])
        copy = ms.get("copy_gbs")
        out += ["", f"The copy bandwidth they are measured against: {_val(copy)}.", ""] if copy else [""]
    ttft = _sorted_by(ms, "ttft_ms_", "prompt_len")
    if ttft:
        out += ["### Prefill: time to first token by prompt length", ""]
        out += md_table(["prompt tokens", "TTFT median (ms)", "p20 (ms)", "p80 (ms)", "runs"],
                        [(m.extra.get("prompt_len"), m.value, m.extra.get("p20_ms"), m.extra.get("p80_ms"),
                          m.extra.get("runs")) for m in ttft])
        out.append("")
    kv = ms.get("kv_growth_bytes_per_step")
    if kv:
        out += ["### KV cache growth per decode step", ""]
        out += md_table(["measured", "predicted by your calculator (bytes)", "relative error", "model"],
                        [(_val(kv), kv.extra.get("predicted"), kv.extra.get("error"), kv.extra.get("model"))])
        out.append("")
    quant = [m for k, m in ms.items() if k.startswith("quant_")]
    if quant:
        out += ["### Quantized weights against the reference", ""]
        out += md_table(["mode", "weight bytes", "memory saving (x)", "perplexity", "perplexity change", "tokens/s",
                         "TPOT (ms)"],
                        [(m.extra.get("mode"), m.value, m.extra.get("memory_saving"), m.extra.get("perplexity"),
                          m.extra.get("perplexity_change"), m.extra.get("tokens_per_s"), m.extra.get("tpot_ms"))
                         for m in quant])
        skipped = next((m.extra["skipped"] for m in quant if m.extra.get("skipped")), None)
        out += ["", f"Reference: {num(quant[0].extra.get('reference'))}."
                + (f" Not measured: {num(skipped)}." if skipped else ""), ""]
    batches = _sorted_by(ms, "batch_", "batch")
    if batches:
        out += ["### Batching: decode throughput by batch", ""]
        out += md_table(["batch", "tokens/s", "TPOT (ms)", "TTFT (ms)"],
                        [(m.extra.get("batch"), m.value, m.extra.get("tpot_ms"), m.extra.get("ttft_ms")) for m in batches])
        out.append("")
    return out


_RUN_COLS = ["run", "offered (req/s)", "completed", "failed", "requests/s", "output tokens/s", "goodput (req/s)",
             "TTFT p50 (ms)", "TTFT p95 (ms)", "TPOT p95 (ms)", "E2E p95 (ms)"]


def _load_row(label: object, run: dict) -> tuple:
    return (label, get(run, "workload", "request_rate"), run.get("completed"), run.get("failed"),
            run.get("request_throughput"), run.get("output_throughput"), get(run, "goodput", "request_goodput"),
            get(run, "ttft_ms", "p50"), get(run, "ttft_ms", "p95"), get(run, "tpot_ms", "p95"), get(run, "e2el_ms", "p95"))


def lab04(rec: Record) -> list[str]:
    ms = rec.measurements
    out = []
    cap, good, choice = ms.get("capacity_rps"), ms.get("goodput_rps"), ms.get("choice_goodput_rps")
    steps = [s for s in get(cap, "extra", "steps", default=[]) or [] if isinstance(s, dict)] if cap else []
    if steps:
        slo = get(cap.extra, "workload", "slo_ms")
        out += ["### The load sweep", ""]
        out += md_table(_RUN_COLS, [_load_row(s.get("label") or i, s) for i, s in enumerate(steps)])
        out += ["", f"Engine {num(cap.extra.get('engine'))} serving {num(cap.extra.get('preset'))} "
                f"({num(cap.extra.get('dtype'))})" + (f"; the SLOs (ms): {', '.join(f'{k} {num(v)}' for k, v in slo.items())}"
                                                     if isinstance(slo, dict) else "") + ".", ""]
    if cap or good:
        out += ["### Capacity and the operating point", ""]
        out += md_table(["what", "value"], [
            ("capacity: the highest rate that held the SLOs", _val(cap)), ("operating rate (req/s)", get(good, "extra", "rate")),
            ("goodput at the operating rate", _val(good)), ("p95 E2E latency there (ms)", get(good, "extra", "p95_e2el_ms"))])
        op = get(good, "extra", "operating")
        if isinstance(op, dict):
            out += ["", *md_table(_RUN_COLS, [_load_row("operating point", op)])]
        out.append("")
    cands = get(choice, "extra", "candidates") if choice else None
    if isinstance(cands, dict) and cands:
        out += ["### Candidate configurations at the operating rate", ""]
        out += md_table(_RUN_COLS, [_load_row(k, v) for k, v in cands.items() if isinstance(v, dict)])
        ch = choice.extra.get("choice")
        if isinstance(ch, dict):
            out += ["", f"Chosen: {num(ch.get('config'))}, {_val(choice)} of goodput; why: {num(ch.get('why'))}"]
        out.append("")
    return out


def lab05(rec: Record) -> list[str]:
    ms = rec.measurements
    out = []
    decode = sorted((m for k, m in ms.items() if k.startswith("decode_b")), key=lambda m: get(m.extra, "batch", default=0))
    if decode:
        out += ["### Decode by batch", ""]
        out += md_table(["batch", "tokens/s", "TPOT (ms)", "prompt tokens", "new tokens", "model"],
                        [(m.extra.get("batch"), m.value, m.extra.get("tpot_ms"), m.extra.get("prompt_len"),
                          m.extra.get("new_tokens"), m.extra.get("model")) for m in decode])
        out.append("")
    costs = [ms[k] for k in ("usd_per_sample", "usd_per_million_tokens") if k in ms]
    if costs:
        out += ["### Cost on this card", ""]
        out += md_table(["what", "value", "price row", "price (USD per GPU-hour)", "from"],
                        [(m.name, _val(m), m.extra.get("price_row"), m.extra.get("usd_per_gpu_hour"),
                          ", ".join(f"{k} {num(v)}" for k, v in m.extra.items() if k in ("samples_per_s", "tokens_per_s", "batch")))
                         for m in costs])
        out.append("")
    rs = ms.get("right_sizing_usd_per_hour")
    if rs:
        ex = rs.extra
        out += ["### Right-sizing: the cheapest card that meets the latency SLO", ""]
        out += md_table(["what", "value"], [("choice", ex.get("choice")), ("GPUs", ex.get("n_gpus")), ("cost", _val(rs)),
                                            ("TPOT SLO (ms)", ex.get("slo_ms")), ("demand (tokens/s)", ex.get("demand_per_s"))])
        cands = [c for c in ex.get("candidates") or [] if isinstance(c, dict)]
        if cands:
            out += ["", "Every candidate (estimated ones scale your measured TPOT by the card's bandwidth):", ""]
            slo = ex.get("slo_ms")

            def meets(c: dict) -> str:
                lat = c.get("latency_ms")
                return num(lat <= slo) if isinstance(lat, (int, float)) and isinstance(slo, (int, float)) else "-"

            out += md_table(["candidate", "basis", "USD per GPU-hour", "tokens/s per GPU", "TPOT (ms)", "meets the SLO"],
                            [(c.get("name"), c.get("basis"), c.get("usd_per_gpu_hour"), c.get("throughput_per_s"),
                              c.get("latency_ms"), meets(c)) for c in cands])
        out.append("")
    ck = ms.get("checkpoint_sync_save_ms")
    if ck:
        ex = ck.extra
        out += ["### Checkpointing: sync against async", ""]
        out += md_table(["what", "median (ms)", "overhead (% of the steps between checkpoints)"], [
            ("training step", get(ex, "step", "median_ms"), "-"),
            ("sync save", get(ex, "sync_save", "median_ms"), ex.get("sync_pct")),
            ("async save: training blocked", get(ex, "async_blocking", "median_ms"), ex.get("async_pct")),
            ("async save: until written", get(ex, "async_total", "median_ms"), "-")])
        out += ["", f"A checkpoint every {num(ex.get('every'))} steps of {num(ex.get('model'))}, "
                f"{num(ex.get('checkpoint_bytes'))} bytes.", ""]
    rest = [ms[k] for k in ("jax_compile_ms", "resume_identical") if k in ms]
    if rest:
        out += ["### Compilation and fault tolerance", ""]
        out += md_table(["measurement", "value", "details"],
                        [(m.name, _val(m), ", ".join(f"{k} {num(v) if not isinstance(v, list) else ', '.join(map(num, v)) or '-'}"
                                                     for k, v in m.extra.items())) for m in rest])
        out.append("")
    return out


SECTIONS: dict[str, Callable[[Record], list[str]]] = {
    "00_foundations": lab00,
    "01_single_gpu": lab01,
    "02_multi_gpu": lab02,
    "03_inference_serving": lab03,
    "04_benchmarking_production": lab04,
    "05_hardware_and_cost": lab05,
}
