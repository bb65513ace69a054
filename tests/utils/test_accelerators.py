"""utils.capacity.accelerators: the sourced accelerator and price tables, the bandwidth-scaled
"cheapest accelerator for a TPOT SLO" arithmetic, and the doc table generated from them."""
from __future__ import annotations

import dataclasses
import math

import pytest

from utils.capacity import accelerators as acc
from utils.capacity.accelerators import (
    ACCELERATOR_PRICES,
    ACCELERATORS,
    NO_PRICE,
    Accelerator,
    cheapest_for_slo,
)
from utils.capacity.cost import PRICES, GpuPrice
from utils.device.hardware import SPECS

EXACT = {"rel": 1e-12}
NUMERIC = ("bf16_tflops", "fp8_tflops", "int8_tops", "int8_tops_sparse", "memory_gb", "bandwidth_gbs", "power_w")

# -- the tables ---------------------------------------------------------------------------------


def test_every_row_has_a_source_a_date_and_positive_or_missing_numbers():
    assert {"inf2", "trn1", "L4", "L40S", "tpu-v5e", "tpu-v6e", "jetson-agx-orin-64gb"} <= set(ACCELERATORS)
    for key, a in ACCELERATORS.items():
        assert a.key == key
        assert a.source.strip() and a.as_of.strip(), key
        assert a.formats and a.engines, key
        for field in NUMERIC:
            value = getattr(a, field)
            assert value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0), (key, field, value)


def test_a_missing_figure_is_explained_in_the_note():
    for key, a in ACCELERATORS.items():
        missing = [f for f in NUMERIC if getattr(a, f) is None]
        if missing:
            assert "stated" in a.note or "None" in a.note, (key, missing)


def test_l4_and_l40s_come_from_the_gpu_spec_table():
    for key in ("L4", "L40S"):
        a, spec = ACCELERATORS[key], SPECS[key]
        assert (a.bf16_tflops, a.memory_gb, a.bandwidth_gbs) == (spec.bf16_tflops, spec.memory_gb, spec.bandwidth_gbs)
        assert f"SPECS['{key}']" in a.source


def test_price_rows_are_dated_sourced_and_name_a_table_row():
    assert {p.gpu for p in ACCELERATOR_PRICES} == set(ACCELERATORS) - set(NO_PRICE)
    for p in ACCELERATOR_PRICES:
        assert isinstance(p, GpuPrice) and p.gpu in ACCELERATORS
        assert p.source.strip() and p.as_of.strip(), p.product
        assert p.on_demand_usd_per_gpu_hour > 0
    # the L4 row is the one utils.capacity.cost already carries, not a copy
    assert any(p is q for p in ACCELERATOR_PRICES for q in PRICES if q.gpu == "L4")
    trn2 = next(p for p in ACCELERATOR_PRICES if p.gpu == "trn2")
    assert trn2.on_demand_usd_per_gpu_hour == pytest.approx(85.964 / 16, **EXACT)


def test_the_doc_table_is_the_generated_one():
    assert acc.doc_block() == acc.markdown(), "run: python -m utils.capacity.accelerators --write-doc"
    assert "prices change: dated, check before use" in acc.markdown()


def test_markdown_entry_point_prints_the_tables(capsys):
    assert acc.main(["--markdown"]) == 0
    assert capsys.readouterr().out.strip() == acc.markdown()


# -- cheapest_for_slo on hand-computed cases ---------------------------------------------------

def _row(key: str, bandwidth_gbs: float, memory_gb: float) -> Accelerator:
    return Accelerator(key, key, "test", None, None, None, None, memory_gb, bandwidth_gbs, None,
                       ("BF16",), ("test",), "test row", "2026-01-01")


def _price(key: str, usd_per_hour: float) -> GpuPrice:
    return GpuPrice(key, "test", key, "test", 1, usd_per_hour, None, "instance", "test price", "2026-01-01")


TABLE = {r.key: r for r in (_row("fast", 2000, 80), _row("mid", 1250, 80), _row("slow", 1000, 80),
                            _row("small", 4000, 16))}
TABLE_PRICES = (_price("fast", 3.0), _price("mid", 1.0), _price("slow", 0.5), _price("small", 0.25))
HOURS = 730.0
DEMAND = 1800.0  # output tokens/s
MONTH = DEMAND * HOURS * 3600  # 4,730,400,000 tokens a month


def _case(**kw):
    args = dict(measured_tpot_ms=10.0, batch_size=4, slo_tpot_ms=8.0, output_tokens_per_month=MONTH,
                model_bytes=20e9, measured_bandwidth_gbs=1000.0, accelerators=TABLE, prices=TABLE_PRICES)
    args.update(kw)
    return cheapest_for_slo(**args)


def test_bandwidth_scaling_slo_and_memory_rejections_and_the_monthly_cost():
    choice = _case()
    assert choice.demand_tokens_per_s == pytest.approx(DEMAND, **EXACT)
    assert choice.measured_bandwidth_gbs == 1000.0
    by = {o.accelerator: o for o in choice.options}
    assert list(by) == ["mid", "fast"]  # sorted by monthly cost
    # fast: 10 ms * 1000/2000 = 5 ms; 4 tokens per 5 ms = 800 tokens/s; ceil(1800/800) = 3 devices
    assert by["fast"].scaled_tpot_ms == pytest.approx(5.0, **EXACT)
    assert by["fast"].tokens_per_s_per_device == pytest.approx(800.0, **EXACT)
    assert by["fast"].devices == 3
    assert by["fast"].monthly_cost_usd == pytest.approx(3 * 3.0 * 730, **EXACT)  # $6,570
    # mid: 10 * 1000/1250 = 8 ms, exactly the SLO (kept); 500 tokens/s; 4 devices at $1: $2,920
    assert by["mid"].scaled_tpot_ms == pytest.approx(8.0, **EXACT)
    assert by["mid"].tokens_per_s_per_device == pytest.approx(500.0, **EXACT)
    assert by["mid"].devices == 4
    assert by["mid"].monthly_cost_usd == pytest.approx(2920.0, **EXACT)
    assert choice.cheapest is by["mid"]
    why = {r.accelerator: r for r in choice.rejected}
    assert set(why) == {"slow", "small"}
    assert why["slow"].scaled_tpot_ms == pytest.approx(10.0, **EXACT)
    assert why["slow"].reason == "scaled TPOT 10 ms > SLO 8 ms"
    assert why["small"].scaled_tpot_ms == pytest.approx(2.5, **EXACT)  # fast enough, but 20 GB > 16 GB
    assert why["small"].reason == "model needs 20 GB, one device holds 16 GB"


def test_a_small_volume_still_needs_one_device_and_none_qualifying_gives_no_cheapest():
    one = _case(output_tokens_per_month=1.0, candidates=["mid"])
    assert one.cheapest.devices == 1
    assert one.cheapest.monthly_cost_usd == pytest.approx(730.0, **EXACT)
    none = _case(slo_tpot_ms=1.0)
    assert none.cheapest is None and none.options == ()
    assert len(none.rejected) == len(TABLE)


def test_scaling_from_a_measured_gpu_in_the_spec_table():
    # real tables: measured on an L4 (300 GB/s datasheet), Inferentia2 reads 820 GB/s
    choice = cheapest_for_slo(measured_tpot_ms=41.0, batch_size=1, slo_tpot_ms=100.0,
                              output_tokens_per_month=1e6, model_bytes=1e9, measured_gpu="L4",
                              candidates=["inf2"])
    assert choice.measured_bandwidth_gbs == 300.0
    assert choice.cheapest.scaled_tpot_ms == pytest.approx(41.0 * 300 / 820, **EXACT)  # 15 ms
    assert choice.cheapest.usd_per_device_hour == pytest.approx(0.7582, **EXACT)
    by_name = cheapest_for_slo(measured_tpot_ms=41.0, batch_size=1, slo_tpot_ms=100.0,
                               output_tokens_per_month=1e6, model_bytes=1e9,
                               measured_gpu="NVIDIA H200", candidates=["inf2"])
    assert by_name.measured_bandwidth_gbs == 4800.0


def test_default_candidates_are_the_priced_accelerators():
    choice = cheapest_for_slo(measured_tpot_ms=40.0, batch_size=8, slo_tpot_ms=1e6, output_tokens_per_month=2e9,
                              model_bytes=1e9, measured_gpu="L4")
    seen = {o.accelerator for o in choice.options} | {r.accelerator for r in choice.rejected}
    assert seen == set(ACCELERATORS) - set(NO_PRICE)
    costs = [o.monthly_cost_usd for o in choice.options]
    assert costs == sorted(costs) and all(math.isfinite(c) for c in costs)


# -- bad input: one-line ValueErrors -----------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    ({"measured_tpot_ms": -1.0}, "measured_tpot_ms must be a positive number"),
    ({"slo_tpot_ms": 0.0}, "slo_tpot_ms must be a positive number"),
    ({"output_tokens_per_month": -5.0}, "output_tokens_per_month must be a positive number"),
    ({"model_bytes": -1.0}, "model_bytes must be a positive number"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"measured_bandwidth_gbs": -300.0}, "measured_bandwidth_gbs must be a positive number"),
    ({"candidates": ["nope"]}, "unknown accelerator 'nope'"),
    ({"candidates": []}, "at least one candidate"),
    ({"measured_gpu": "L4"}, "exactly one of measured_gpu"),
])
def test_bad_input_raises_one_line(kw, match):
    with pytest.raises(ValueError, match=match) as err:
        _case(**kw)
    assert "\n" not in str(err.value)


def test_unknown_gpu_and_missing_price_raise_one_line():
    base = dict(measured_tpot_ms=40.0, batch_size=8, slo_tpot_ms=100.0, output_tokens_per_month=1e9, model_bytes=1e9)
    with pytest.raises(ValueError, match="no datasheet bandwidth for GPU 'GeForce 256'") as e1:
        cheapest_for_slo(**base, measured_gpu="GeForce 256")
    with pytest.raises(ValueError, match="no on-demand price for 'jetson-agx-orin-64gb'") as e2:
        cheapest_for_slo(**base, measured_gpu="L4", candidates=["jetson-agx-orin-64gb"])
    no_bw = {"x": dataclasses.replace(TABLE["mid"], key="x", bandwidth_gbs=None)}
    with pytest.raises(ValueError, match="no memory bandwidth") as e3:
        cheapest_for_slo(**base, measured_gpu="L4", accelerators=no_bw, prices=(_price("x", 1.0),))
    assert all("\n" not in str(e.value) for e in (e1, e2, e3))
