"""utils.capacity.cost: exact cost arithmetic, spot vs on-demand, checkpoint intervals (Young, and
Daly's own published checks), right-sizing, MIG profiles and time-slicing."""
from __future__ import annotations

import math

import pytest

from utils.capacity import cost
from utils.capacity.cost import (
    PRICES,
    PRICES_LABEL,
    Candidate,
    GpuPrice,
    break_even_preemptions_per_h,
    compare_spot_on_demand,
    cost_per_million_tokens_usd,
    cost_per_sample_usd,
    gpu_price_usd_per_hour,
    gpus_needed,
    mig_gpus_needed,
    mig_profile,
    mig_profiles,
    mig_usd_per_instance_hour,
    on_demand_job,
    optimal_checkpoint_interval_h,
    price_table,
    right_size,
    smallest_mig_profile,
    spot_job,
    time_slicing,
)

EXACT = {"rel": 1e-12}

# -- cost per unit of work -------------------------------------------------------------------


def test_cost_per_sample_and_per_million_tokens():
    # $3.60/GPU-hour at 100 samples/s: 360,000 samples an hour, $0.00001 each
    assert cost_per_sample_usd(100, 3.6) == pytest.approx(1e-5, **EXACT)
    assert cost_per_sample_usd(100, 3.6, n_gpus=4) == pytest.approx(4e-5, **EXACT)
    # 1000 tokens/s for $3.60/h: 3.6M tokens an hour, $1.00 per million
    assert cost_per_million_tokens_usd(1000, 3.6) == pytest.approx(1.0, **EXACT)
    assert cost_per_million_tokens_usd(2500, 4.0, n_gpus=2) == pytest.approx(8.0 * 1e6 / (2500 * 3600), **EXACT)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "10", True])
def test_cost_rejects_bad_throughput(bad):
    with pytest.raises(ValueError, match="tokens_per_s must be a positive number"):
        cost_per_million_tokens_usd(bad, 2.0)


# -- the price table -------------------------------------------------------------------------

def test_every_price_row_is_sourced_and_dated():
    assert PRICES_LABEL == "prices change: dated, check before use"
    gpus = {p.gpu for p in PRICES}
    assert {"T4", "L4", "A10G", "A100-40GB", "A100-80GB", "H100-SXM", "H200"} <= gpus
    for p in PRICES:
        assert p.source.strip() and p.as_of.strip(), p
        assert "http" in p.source, p
        assert p.quoted_per in ("instance", "gpu")
        assert p.on_demand_usd_per_hour is None or p.on_demand_usd_per_hour > 0
        assert p.spot_usd_per_hour is None or 0 < p.spot_usd_per_hour
        if p.spot_usd_per_hour and p.on_demand_usd_per_hour:
            assert p.spot_usd_per_hour < p.on_demand_usd_per_hour, p


def test_instance_prices_are_divided_by_gpus_per_instance():
    p5 = next(p for p in PRICES if p.product.startswith("p5.48xlarge"))
    assert p5.quoted_per == "instance" and p5.gpus_per_instance == 8
    assert p5.on_demand_usd_per_gpu_hour == pytest.approx(55.04 / 8, **EXACT)
    per_gpu = GpuPrice("X", "p", "1x", "r", 8, 2.0, 1.0, "gpu", "https://example", "2026-01-01")
    assert per_gpu.on_demand_usd_per_gpu_hour == 2.0 and per_gpu.spot_usd_per_gpu_hour == 1.0
    rows = price_table()
    assert len(rows) == len(PRICES) and rows[0]["on_demand_usd_per_gpu_hour"] == PRICES[0].on_demand_usd_per_gpu_hour


def test_gpu_price_lookup_takes_the_cheapest_and_accepts_a_table():
    h100 = [p for p in PRICES if p.gpu == "H100-SXM"]
    assert gpu_price_usd_per_hour("H100-SXM") == min(p.on_demand_usd_per_gpu_hour for p in h100)
    assert gpu_price_usd_per_hour("h100-sxm", kind="spot") == 6.571  # the only sourced H100 spot row (GCP)
    mine = [GpuPrice("L4", "mycloud", "1x L4", "eu", 1, 0.5, 0.2, "gpu", "https://example", "2026-12-01")]
    assert gpu_price_usd_per_hour("L4", kind="spot", prices=mine) == 0.2
    with pytest.raises(ValueError, match=r"no spot price for 'A100-80GB'.*it has: .*H200 \(runpod\)"):
        gpu_price_usd_per_hour("A100-80GB", kind="spot")
    with pytest.raises(ValueError, match="kind must be"):
        gpu_price_usd_per_hour("L4", kind="reserved")


# -- spot vs on-demand -----------------------------------------------------------------------

SPOT = dict(checkpoint_interval_h=1.0, checkpoint_write_h=0.05, restart_h=0.1)


def test_spot_job_follows_the_expected_lost_work_model():
    # 100 h of work, a 3-minute checkpoint every hour, 6-minute restarts, 0.1 preemptions/h:
    # wall = 100 * (1 + 0.05/1) / (1 - 0.1 * (1/2 + 0.1)) = 105 / 0.94
    job = spot_job(100, 1.2, preemptions_per_h=0.1, **SPOT)
    assert job.finishes and job.kind == "spot"
    assert job.wall_h == pytest.approx(105 / 0.94, **EXACT)
    assert job.cost_usd == pytest.approx(1.2 * 105 / 0.94, **EXACT)
    assert job.expected_preemptions == pytest.approx(0.1 * 105 / 0.94, **EXACT)
    assert job.checkpoints == 100 and job.useful_fraction == pytest.approx(100 / (105 / 0.94), **EXACT)
    # without preemptions only the checkpoint overhead remains
    assert spot_job(100, 1.0, preemptions_per_h=0, **SPOT).wall_h == pytest.approx(105.0, **EXACT)


def test_on_demand_job():
    assert on_demand_job(100, 4.0).cost_usd == 400.0
    ckpt = on_demand_job(100, 4.0, checkpoint_interval_h=2.0, checkpoint_write_h=0.1)
    assert ckpt.wall_h == pytest.approx(105.0, **EXACT) and ckpt.checkpoints == 50


def test_spot_is_cheaper_at_a_low_preemption_rate():
    c = compare_spot_on_demand(100, 4.0, 1.2, preemptions_per_h=0.1, **SPOT)
    assert c["cheaper"] == "spot"
    assert c["spot_saving_fraction"] == pytest.approx(1 - (1.2 * 105 / 0.94) / 400, **EXACT)


def test_spot_costs_more_when_preemptions_are_frequent():
    # 1.5 preemptions/h waste 0.9 of every hour: wall = 105 / 0.1 = 1050 h, $1260 vs $400
    c = compare_spot_on_demand(100, 4.0, 1.2, preemptions_per_h=1.5, **SPOT)
    assert c["cheaper"] == "on_demand"
    assert c["spot"].wall_h == pytest.approx(1050.0, **EXACT)
    assert c["spot"].cost_usd == pytest.approx(1260.0, **EXACT) and c["spot_saving_fraction"] < 0


def test_spot_never_finishes_when_preemptions_outpace_progress():
    job = spot_job(100, 1.2, preemptions_per_h=2.0, **SPOT)  # 2 * 0.6 >= 1
    assert not job.finishes and math.isinf(job.wall_h) and math.isinf(job.cost_usd) and job.useful_fraction == 0
    assert compare_spot_on_demand(100, 4.0, 1.2, preemptions_per_h=2.0, **SPOT)["cheaper"] == "on_demand"


def test_break_even_rate_makes_both_cost_the_same():
    lam = break_even_preemptions_per_h(4.0, 1.2, **SPOT)
    assert lam == pytest.approx((1 - 0.3 * 1.05) / 0.6, **EXACT)
    assert spot_job(100, 1.2, preemptions_per_h=lam, **SPOT).cost_usd == pytest.approx(400.0, rel=1e-9)
    # spot that is not cheaper even without preemptions never breaks even
    assert break_even_preemptions_per_h(1.0, 0.99, checkpoint_interval_h=0.1, checkpoint_write_h=0.05, restart_h=0) == 0


def test_young_interval():
    # sqrt(2 * delta * MTBF): a 6-minute checkpoint, one preemption every 10 hours
    assert optimal_checkpoint_interval_h(0.1, 10) == pytest.approx(math.sqrt(2.0), **EXACT)
    assert optimal_checkpoint_interval_h(0.5, 4) == pytest.approx(2.0, **EXACT)


@pytest.mark.parametrize("mtbf_min, expected_min, digits", [(24 * 60, 117, 0), (6 * 60, 57, 0), (15, 9.1, 1)])
def test_daly_interval_matches_the_papers_checks(mtbf_min, expected_min, digits):
    # Daly 2006, figures 3-5: delta = 5 min; M = 24 h, 6 h, 15 min -> 117, 57, 9.1 min
    tau_h = optimal_checkpoint_interval_h(5 / 60, mtbf_min / 60, method="daly")
    assert round(tau_h * 60, digits) == expected_min


def test_daly_interval_edge_and_errors():
    assert optimal_checkpoint_interval_h(3.0, 1.0, method="daly") == 1.0  # delta >= 2M: checkpoint every M
    with pytest.raises(ValueError, match="method must be 'young' or 'daly'"):
        optimal_checkpoint_interval_h(0.1, 10, method="guess")
    with pytest.raises(ValueError, match="mtbf_h must be a positive number"):
        optimal_checkpoint_interval_h(0.1, 0)


# -- right-sizing ----------------------------------------------------------------------------

CANDIDATES = [
    Candidate("T4", 0.526, throughput_per_s=40, latency_ms=180),
    Candidate("L4", 0.8048, throughput_per_s=90, latency_ms=80),
    Candidate("A100-80GB", 2.0, throughput_per_s=400, latency_ms=40, basis="estimated"),
    Candidate("H100-SXM", 3.99, throughput_per_s=1000, latency_ms=25),
]


def test_right_size_picks_the_cheapest_that_meets_the_slo():
    # 1000 req/s within 100 ms: L4 needs 12 ($9.66/h), A100 3 ($6/h), H100 1 ($3.99/h); T4 misses the SLO
    r = right_size(CANDIDATES, latency_slo_ms=100, demand_per_s=1000)
    assert r.choice.name == "H100-SXM" and r.n_gpus == 1 and r.usd_per_hour == 3.99
    by_name = {o["name"]: o for o in r.options}
    assert by_name["T4"]["meets_slo"] is False and "180 ms > SLO 100 ms" in by_name["T4"]["reason"]
    assert by_name["L4"]["n_gpus"] == 12 and by_name["L4"]["usd_per_hour"] == pytest.approx(12 * 0.8048, **EXACT)
    # at 300 req/s one A100 ($2/h) beats one H100 and four L4s ($3.22/h)
    r = right_size(CANDIDATES, latency_slo_ms=100, demand_per_s=300)
    assert r.choice.name == "A100-80GB" and r.n_gpus == 1
    # a looser SLO lets the T4 in: 8 T4s ($4.21/h) still lose to one A100
    assert right_size(CANDIDATES, latency_slo_ms=200, demand_per_s=300).choice.name == "A100-80GB"


def test_right_size_errors_clearly_when_nothing_meets_the_slo():
    with pytest.raises(ValueError, match=r"no candidate meets the latency SLO of 20 ms: T4 \(180 ms\), L4 \(80 ms\)"):
        right_size(CANDIDATES, latency_slo_ms=20, demand_per_s=100)
    with pytest.raises(ValueError, match="at least one candidate"):
        right_size([], latency_slo_ms=20, demand_per_s=100)


def test_right_size_accepts_dicts_and_names_missing_fields():
    r = right_size([{"name": "L4", "usd_per_gpu_hour": 0.8, "throughput_per_s": 50, "latency_ms": 90}],
                   latency_slo_ms=100, demand_per_s=120)
    assert r.n_gpus == 3 and r.usd_per_hour == pytest.approx(2.4, **EXACT)
    with pytest.raises(ValueError, match="a candidate needs name"):
        right_size([{"name": "L4", "price": 1}], latency_slo_ms=100, demand_per_s=1)


def test_gpus_needed_is_a_ceiling_without_float_artefacts():
    assert gpus_needed(1000, 90) == 12 and gpus_needed(1000, 250) == 4 and gpus_needed(1, 1000) == 1
    assert 0.1 * 3 / 0.1 > 3  # 3.0000000000000004: a plain ceil would buy a fourth GPU
    assert gpus_needed(0.1 * 3, 0.1) == 3


# -- MIG and time-slicing ----------------------------------------------------------------------

def test_mig_profiles_from_the_user_guide():
    p = mig_profile("A100-40GB", "1g.5gb")
    assert (p.max_instances, p.memory_gb, p.compute_fraction, p.memory_fraction) == (7, 5, 1 / 7, 1 / 8)
    p = mig_profile("A100-40GB", "MIG 3g.20gb")
    assert (p.max_instances, p.memory_gb, p.compute_slices, p.memory_fraction) == (2, 20, 3, 0.5)
    assert mig_profile("A100-40GB", "1g.10gb").memory_slices == 2
    assert [q.name for q in mig_profiles("H100-SXM")] == ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb",
                                                          "4g.40gb", "7g.80gb"]
    assert mig_profile("NVIDIA A100-SXM4-80GB", "7g.80gb").compute_fraction == 1.0
    assert mig_profile("NVIDIA H100 80GB HBM3", "1g.10gb+me").media_extensions
    assert all(q.memory_gb == q.memory_slices * 10 for q in mig_profiles("A100-80GB"))


def test_mig_errors_name_what_exists():
    with pytest.raises(ValueError, match="no MIG profiles for 'T4'.*time-slicing"):
        mig_profiles("T4")
    with pytest.raises(ValueError, match=r"A100-40GB has no MIG profile '1g.10gb\+xx'; it has: 1g.5gb"):
        mig_profile("A100-40GB", "1g.10gb+xx")


def test_mig_arithmetic():
    assert smallest_mig_profile("A100-40GB", 8).name == "1g.10gb"
    assert smallest_mig_profile("A100-40GB", 8, compute_fraction=0.25).name == "2g.10gb"
    assert smallest_mig_profile("H100-SXM", 45).name == "7g.80gb"
    with pytest.raises(ValueError, match="no A100-40GB MIG profile has 50 GB"):
        smallest_mig_profile("A100-40GB", 50)
    assert mig_gpus_needed("A100-80GB", "1g.10gb", 7) == 1 and mig_gpus_needed("A100-80GB", "1g.10gb", 10) == 2
    assert mig_gpus_needed("A100-80GB", "3g.40gb", 5) == 3
    assert mig_usd_per_instance_hour(3.43, "A100-80GB", "3g.40gb") == pytest.approx(1.715, **EXACT)
    assert mig_usd_per_instance_hour(7.0, "A100-40GB", "1g.5gb") == pytest.approx(1.0, **EXACT)


def test_time_slicing_shares_time_but_not_memory():
    ts = time_slicing([5, 5], gpu_memory_gb=16)
    assert ts.fits and ts.time_share == 0.5 and ts.total_memory_gb == 10 and ts.headroom_gb == 6
    ts = time_slicing([6, 6, 6], gpu_memory_gb=16)  # each fits alone; together they do not
    assert not ts.fits and ts.time_share == pytest.approx(1 / 3, **EXACT) and ts.headroom_gb == -2
    with pytest.raises(ValueError, match="at least one process"):
        time_slicing([], 16)
    with pytest.raises(ValueError, match="non-negative"):
        time_slicing([-1], 16)


def test_module_docstring_carries_the_label_and_sources():
    doc = cost.__doc__
    assert PRICES_LABEL in doc and "Young (1974)" in doc and "Daly 2006" in doc and "MIG User Guide" in doc
