"""What GPU work costs: per sample, per 1M tokens, on spot vs on-demand, right-sized, shared.

Pure arithmetic: measured throughput and a price go in, dollars and hours come out, so
every function runs (and is graded exactly) on a CPU. The price table is data, not truth:

**prices change: dated, check before use.** Every row of :data:`PRICES` carries the page
it came from and the date it was read; a notebook passes its own table (``prices=``)
when it knows better. Instance prices are divided by the GPUs in the instance and the
row says so (``quoted_per="instance"``). Rows were transcribed from public pages through
third-party snapshots (named in each ``source``), because this project cannot fetch the
providers' pages itself; where no sourced number was found the field is None, never a
guess.

Models, with their sources:

- Spot jobs (:func:`spot_job`): the first-order expected-lost-work model of Young (1974):
  checkpoints every ``tau`` hours of work, each costing ``delta`` hours; preemptions
  arrive as a Poisson process at ``lam`` per wall-clock hour; each one loses on average
  half a checkpoint interval of work (``tau/2``) plus a restart of ``R`` hours.
- Checkpoint interval (:func:`optimal_checkpoint_interval_h`): Young's
  ``sqrt(2 * delta * MTBF)`` and Daly's higher-order correction (Daly 2006).
- MIG (:data:`MIG_PROFILES`): NVIDIA's MIG User Guide, "Supported MIG Profiles".
- Time-slicing (:func:`time_slicing`): the NVIDIA k8s device plugin's
  ``sharing.timeSlicing`` shares a GPU by time, with no memory isolation.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from utils import validate

PRICES_LABEL = "prices change: dated, check before use"

# -- the price table ----------------------------------------------------------------------


@dataclass(frozen=True)
class GpuPrice:
    """One offer. ``*_usd_per_hour`` are as quoted: per instance or per GPU (``quoted_per``);
    the ``*_per_gpu_hour`` properties divide instance prices by ``gpus_per_instance``."""

    gpu: str  # utils.device.hardware.SPECS key where one exists ("H100-SXM"), else the card's name ("A10G")
    provider: str
    product: str  # instance type or offer name
    region: str
    gpus_per_instance: int
    on_demand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    quoted_per: str  # "instance" or "gpu"
    source: str
    as_of: str  # the date the page was read, or why there is none
    note: str = ""

    def _per_gpu(self, usd: float | None) -> float | None:
        if usd is None:
            return None
        return usd / self.gpus_per_instance if self.quoted_per == "instance" else usd

    @property
    def on_demand_usd_per_gpu_hour(self) -> float | None:
        return self._per_gpu(self.on_demand_usd_per_hour)

    @property
    def spot_usd_per_gpu_hour(self) -> float | None:
        return self._per_gpu(self.spot_usd_per_hour)


_SKYPILOT = ("AWS EC2 price list (Linux), as recorded in skypilot-org/skypilot-catalog "
             "catalogs/v7/aws/vms.csv @ 001367d2; https://aws.amazon.com/ec2/pricing/on-demand/")
_SKYPILOT_DATE = ("undated catalog snapshot from before AWS's June 2025 P-instance price cut "
                  "(its p5.48xlarge row still reads $98.32/h)")
_SPOT_NOTE = "spot = median of the us-east-1 availability zones in the snapshot ({}); spot moves daily"
_DATARECEIPTS = ("https://aws.amazon.com/ec2/pricing/on-demand/ (us-east-1, Linux), as recorded by "
                 "datareceipts/data-receipts 109-gpu-pricing/hyperscalers.json")
_LAMBDA = "https://lambda.ai/pricing, as recorded by tgarg01/silybench-data derived/csv/gpu_prices.csv"
_RUNPOD = "https://www.runpod.io/pricing, as recorded by tgarg01/silybench-data derived/csv/gpu_prices.csv"
_GCP = ("Google Cloud Billing catalog, https://cloud.google.com/billing/v1/how-tos/catalog-api (Compute Engine "
        "SKUs: GPU + vCPU + RAM), as recorded by tgarg01/silybench-data derived/csv/gpu_prices.csv")

PRICES: tuple[GpuPrice, ...] = (
    GpuPrice("T4", "aws", "g4dn.xlarge (1x T4)", "us-east-1", 1, 0.526, 0.1869, "instance", _SKYPILOT,
             _SKYPILOT_DATE, _SPOT_NOTE.format("0.1845-0.2010")),
    GpuPrice("L4", "aws", "g6.xlarge (1x L4)", "us-east-1", 1, 0.8048, 0.41285, "instance", _SKYPILOT,
             _SKYPILOT_DATE, _SPOT_NOTE.format("0.3879-0.4173")),
    GpuPrice("A10G", "aws", "g5.xlarge (1x A10G)", "us-east-1", 1, 1.006, 0.4028, "instance", _SKYPILOT,
             _SKYPILOT_DATE, _SPOT_NOTE.format("0.3970-0.4177") + "; $1.006 on-demand also quoted for "
             "us-east-1 in June 2026 by factualminds.com"),
    GpuPrice("A100-40GB", "aws", "p4d.24xlarge (8x A100 SXM 40GB)", "us-east-1", 8, 21.957642, None, "instance",
             _DATARECEIPTS, "2026-11-09", "instance price / 8 GPUs"),
    GpuPrice("A100-40GB", "lambda", "8x A100 SXM 40GB", "us", 8, 1.99, None, "gpu", _LAMBDA, "2026-09-25",
             "quoted per GPU; the same $1.99 read from lambda.ai/instances on 2026-09-20 (api-evangelist/lambda-labs)"),
    GpuPrice("A100-80GB", "aws", "p4de.24xlarge (8x A100 SXM 80GB)", "us-east-1", 8, 27.44705, None, "instance",
             _DATARECEIPTS, "2026-11-09", "instance price / 8 GPUs"),
    GpuPrice("A100-80GB", "lambda", "8x A100 SXM 80GB", "us", 8, 2.79, None, "gpu", _LAMBDA, "2026-09-25",
             "quoted per GPU"),
    GpuPrice("A100-80GB", "runpod", "A100 SXM, Community Cloud", "various", 1, 1.39, None, "gpu", _RUNPOD,
             "2026-09-25", "community hosts, no datacentre SLA"),
    GpuPrice("H100-SXM", "aws", "p5.48xlarge (8x H100 SXM)", "us-east-1", 8, 55.04, None, "instance",
             _DATARECEIPTS, "2026-11-09", "instance price / 8 GPUs (after AWS's June 2025 price cut)"),
    GpuPrice("H100-SXM", "lambda", "8x H100 SXM", "us", 8, 3.99, None, "gpu", _LAMBDA, "2026-09-25",
             "quoted per GPU; 1x H100 SXM is $4.29"),
    GpuPrice("H100-SXM", "gcp", "a3-highgpu-1g (1x H100)", "us-central1", 1, 10.9791, 6.571, "instance", _GCP,
             "2026-09-26", "GPU + 26 vCPU + 234 GiB RAM, boot disk excluded; 1g shapes are Spot/Flex-start only, "
             "so the on-demand figure is the on-demand-equivalent list price"),
    GpuPrice("H200", "runpod", "H200, Secure Cloud", "various", 1, 4.59, None, "gpu", _RUNPOD, "2026-09-25",
             "RunPod-operated datacentres"),
    GpuPrice("H200", "runpod", "H200, Community Cloud", "various", 1, 3.59, None, "gpu", _RUNPOD, "2026-09-25",
             "community hosts, no datacentre SLA"),
)


def price_table(prices: Iterable[GpuPrice] = PRICES) -> list[dict]:
    """The table as rows of plain dicts, per-GPU prices included, for display or JSON.
    Print :data:`PRICES_LABEL` beside it."""
    rows = []
    for p in prices:
        d = asdict(p)
        d["on_demand_usd_per_gpu_hour"] = p.on_demand_usd_per_gpu_hour
        d["spot_usd_per_gpu_hour"] = p.spot_usd_per_gpu_hour
        rows.append(d)
    return rows


def gpu_price_usd_per_hour(gpu: str, *, kind: str = "on_demand", provider: str | None = None,
                           prices: Iterable[GpuPrice] = PRICES) -> float:
    """The lowest per-GPU hourly price for ``gpu`` (``kind`` ``"on_demand"`` or ``"spot"``),
    optionally from one ``provider``. Raises ValueError naming what the table has."""
    if kind not in ("on_demand", "spot"):
        raise ValueError(f"kind must be 'on_demand' or 'spot', got {kind!r}")
    prices = list(prices)
    rows = [p for p in prices if p.gpu.lower() == gpu.lower() and (provider is None or p.provider == provider)]
    values = [v for p in rows if (v := getattr(p, f"{kind}_usd_per_gpu_hour")) is not None]
    if not values:
        have = sorted({f"{p.gpu} ({p.provider})" for p in prices})
        raise ValueError(f"no {kind} price for {gpu!r}" + (f" from {provider!r}" if provider else "")
                         + f" in the table; it has: {', '.join(have)}. Pass prices= with your own row.")
    return min(values)


# -- cost per unit of work ----------------------------------------------------------------

_positive = validate.positive
_non_negative = validate.non_negative


def cost_per_sample_usd(samples_per_s: float, usd_per_gpu_hour: float, n_gpus: int = 1) -> float:
    """Dollars per training sample: price of the ``n_gpus`` for an hour / samples in that hour.
    ``samples_per_s`` is the throughput of all ``n_gpus`` together (not per GPU)."""
    rate = _positive("samples_per_s", samples_per_s)
    return _positive("usd_per_gpu_hour", usd_per_gpu_hour) * _positive("n_gpus", n_gpus) / (rate * 3600)


def cost_per_million_tokens_usd(tokens_per_s: float, usd_per_gpu_hour: float, n_gpus: int = 1) -> float:
    """Dollars per 1M generated (or trained) tokens at ``tokens_per_s`` summed over ``n_gpus``.

    Say which tokens: output tokens of a serving benchmark at a stated concurrency, or
    training tokens; never tokens/s without the workload (docs/reference.md)."""
    rate = _positive("tokens_per_s", tokens_per_s)
    return _positive("usd_per_gpu_hour", usd_per_gpu_hour) * _positive("n_gpus", n_gpus) * 1e6 / (rate * 3600)


# -- spot vs on-demand --------------------------------------------------------------------

@dataclass(frozen=True)
class JobEstimate:
    kind: str  # "on_demand" or "spot"
    work_h: float  # useful compute the job needs
    wall_h: float  # expected wall-clock hours (math.inf if it never finishes)
    cost_usd: float
    checkpoints: float  # checkpoints written for the useful work (work_h / interval)
    expected_preemptions: float
    finishes: bool  # False when preemptions arrive faster than the job can recover

    @property
    def useful_fraction(self) -> float:
        return self.work_h / self.wall_h if math.isfinite(self.wall_h) else 0.0


def on_demand_job(work_h: float, usd_per_hour: float, *, checkpoint_interval_h: float | None = None,
                  checkpoint_write_h: float = 0.0) -> JobEstimate:
    """A job on on-demand capacity: no preemptions. With a checkpoint interval it still pays
    for writing checkpoints: wall = work * (1 + delta/tau)."""
    work = _positive("work_h", work_h)
    price = _positive("usd_per_hour", usd_per_hour)
    delta = _non_negative("checkpoint_write_h", checkpoint_write_h)
    if checkpoint_interval_h is None:
        n_ckpt, wall = 0.0, work
    else:
        tau = _positive("checkpoint_interval_h", checkpoint_interval_h)
        n_ckpt, wall = work / tau, work * (1 + delta / tau)
    return JobEstimate("on_demand", work, wall, wall * price, n_ckpt, 0.0, True)


def spot_job(work_h: float, usd_per_hour: float, *, checkpoint_interval_h: float, checkpoint_write_h: float,
             restart_h: float, preemptions_per_h: float) -> JobEstimate:
    """Expected wall time and cost of a job of ``work_h`` hours of compute on spot capacity.

    Young's first-order model (J. W. Young, "A first order approximation to the optimum
    checkpoint interval", CACM 17(9), 1974): writing a checkpoint (``delta`` h) after every
    ``tau`` h of work stretches the work to ``work * (1 + delta/tau)``; preemptions arrive
    at ``lam`` per wall-clock hour, and each wastes on average half a checkpoint interval
    of lost work plus the restart: ``w = tau/2 + R``. A fraction ``lam * w`` of every
    wall-clock hour is wasted, so

        wall = work * (1 + delta/tau) / (1 - lam * (tau/2 + R))

    which counts preemptions during rework and restarts too. When ``lam * w >= 1`` the job
    loses work faster than it makes progress: ``finishes`` is False and wall and cost are
    infinite. The price is paid for the whole wall time (restarts included); time spent
    waiting for spot capacity to return is not modelled.
    """
    work = _positive("work_h", work_h)
    price = _positive("usd_per_hour", usd_per_hour)
    tau = _positive("checkpoint_interval_h", checkpoint_interval_h)
    delta = _non_negative("checkpoint_write_h", checkpoint_write_h)
    restart = _non_negative("restart_h", restart_h)
    lam = _non_negative("preemptions_per_h", preemptions_per_h)
    useful = 1 - lam * (tau / 2 + restart)
    if useful <= 0:
        return JobEstimate("spot", work, math.inf, math.inf, work / tau, math.inf, False)
    wall = work * (1 + delta / tau) / useful
    return JobEstimate("spot", work, wall, wall * price, work / tau, lam * wall, True)


def break_even_preemptions_per_h(on_demand_usd_per_hour: float, spot_usd_per_hour: float, *,
                                 checkpoint_interval_h: float, checkpoint_write_h: float,
                                 restart_h: float) -> float:
    """The preemption rate at which spot costs as much as on-demand (on-demand without
    checkpoints): solve ``p_spot * (1 + delta/tau) / (1 - lam * (tau/2 + R)) = p_od`` for
    ``lam``. Zero when spot, with its checkpoint overhead, is not cheaper even without
    preemptions."""
    p_od = _positive("on_demand_usd_per_hour", on_demand_usd_per_hour)
    p_spot = _positive("spot_usd_per_hour", spot_usd_per_hour)
    tau = _positive("checkpoint_interval_h", checkpoint_interval_h)
    delta = _non_negative("checkpoint_write_h", checkpoint_write_h)
    waste = tau / 2 + _non_negative("restart_h", restart_h)
    lam = (1 - (p_spot / p_od) * (1 + delta / tau)) / waste
    return max(lam, 0.0)


def compare_spot_on_demand(work_h: float, on_demand_usd_per_hour: float, spot_usd_per_hour: float, *,
                           checkpoint_interval_h: float, checkpoint_write_h: float, restart_h: float,
                           preemptions_per_h: float) -> dict:
    """Both estimates side by side: ``on_demand`` (no checkpoints), ``spot``, ``cheaper``,
    ``spot_saving_fraction`` (1 - spot cost / on-demand cost; negative when spot costs
    more) and ``break_even_preemptions_per_h``."""
    od = on_demand_job(work_h, on_demand_usd_per_hour)
    spot = spot_job(work_h, spot_usd_per_hour, checkpoint_interval_h=checkpoint_interval_h,
                    checkpoint_write_h=checkpoint_write_h, restart_h=restart_h,
                    preemptions_per_h=preemptions_per_h)
    saving = 1 - spot.cost_usd / od.cost_usd if spot.finishes else -math.inf
    return {
        "on_demand": od,
        "spot": spot,
        "cheaper": "spot" if spot.cost_usd < od.cost_usd else "on_demand",
        "spot_saving_fraction": saving,
        "break_even_preemptions_per_h": break_even_preemptions_per_h(
            on_demand_usd_per_hour, spot_usd_per_hour, checkpoint_interval_h=checkpoint_interval_h,
            checkpoint_write_h=checkpoint_write_h, restart_h=restart_h),
    }


def optimal_checkpoint_interval_h(checkpoint_write_h: float, mtbf_h: float, method: str = "young") -> float:
    """Hours of work between checkpoints that minimise expected run time.

    - ``"young"``: ``sqrt(2 * delta * M)`` (Young 1974), with ``delta`` the checkpoint
      write time and ``M`` the mean time between failures (``1 / preemptions_per_h``).
    - ``"daly"``: J. T. Daly, "A higher order estimate of the optimum checkpoint interval
      for restart dumps", Future Generation Computer Systems 22(3), 2006:
      ``sqrt(2 delta M) * (1 + sqrt(delta/(2M))/3 + (delta/(2M))/9) - delta`` for
      ``delta < 2M``, else ``M``. The paper's own checks: M = 24 h, 6 h, 15 min with
      delta = 5 min give 117, 57 and 9.1 min.
    """
    delta = _positive("checkpoint_write_h", checkpoint_write_h)
    mtbf = _positive("mtbf_h", mtbf_h)
    if method == "young":
        return math.sqrt(2 * delta * mtbf)
    if method == "daly":
        if delta >= 2 * mtbf:
            return mtbf
        x = delta / (2 * mtbf)
        return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta
    raise ValueError(f"method must be 'young' or 'daly', got {method!r}")


# -- right-sizing -------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """A GPU option for a serving or training workload, measured or estimated at the SLO."""

    name: str
    usd_per_gpu_hour: float
    throughput_per_s: float  # per GPU, at the operating point that gives latency_ms
    latency_ms: float  # the latency statistic the SLO is stated in (p95 TTFT, p99 step time, ...)
    basis: str = "measured"  # "measured" or "estimated": say which


@dataclass(frozen=True)
class RightSizing:
    choice: Candidate
    n_gpus: int
    usd_per_hour: float
    options: list[dict]  # every candidate: meets_slo, n_gpus, usd_per_hour, reason


def _as_candidate(c: Candidate | Mapping) -> Candidate:
    if isinstance(c, Candidate):
        return c
    try:
        return Candidate(**dict(c))
    except TypeError as exc:
        raise ValueError(f"a candidate needs name, usd_per_gpu_hour, throughput_per_s and latency_ms: {exc}") from None


def gpus_needed(demand_per_s: float, throughput_per_gpu_s: float) -> int:
    """``ceil(demand / per-GPU throughput)``, rounded to 9 decimals first so that a float
    quotient like 3.0000000000000004 does not buy a fourth GPU."""
    q = _positive("demand_per_s", demand_per_s) / _positive("throughput_per_gpu_s", throughput_per_gpu_s)
    return max(1, math.ceil(round(q, 9)))


def right_size(candidates: Sequence[Candidate | Mapping], *, latency_slo_ms: float, demand_per_s: float) -> RightSizing:
    """The cheapest way to serve ``demand_per_s`` within ``latency_slo_ms``.

    A candidate qualifies when its latency at its stated per-GPU throughput meets the SLO;
    it then needs ``ceil(demand / throughput)`` GPUs (replicas scale throughput, not
    latency) and costs that many times its hourly price. Ties go to fewer GPUs, then to
    the name. Raises ValueError, naming each candidate's latency, when none qualifies.
    """
    slo = _positive("latency_slo_ms", latency_slo_ms)
    demand = _positive("demand_per_s", demand_per_s)
    cands = [_as_candidate(c) for c in candidates]
    if not cands:
        raise ValueError("right_size needs at least one candidate")
    options, best = [], None
    for c in cands:
        price = _positive(f"{c.name}: usd_per_gpu_hour", c.usd_per_gpu_hour)
        _positive(f"{c.name}: throughput_per_s", c.throughput_per_s)
        latency = _positive(f"{c.name}: latency_ms", c.latency_ms)
        if latency > slo:
            options.append({"name": c.name, "meets_slo": False, "n_gpus": None, "usd_per_hour": None,
                            "reason": f"latency {latency:g} ms > SLO {slo:g} ms"})
            continue
        n = gpus_needed(demand, c.throughput_per_s)
        total = n * price
        options.append({"name": c.name, "meets_slo": True, "n_gpus": n, "usd_per_hour": total,
                        "reason": f"{n} x {c.throughput_per_s:g}/s >= {demand:g}/s at {latency:g} ms"})
        key = (total, n, c.name)
        if best is None or key < best[0]:
            best = (key, c, n, total)
    if best is None:
        seen = ", ".join(f"{c.name} ({c.latency_ms:g} ms)" for c in cands)
        raise ValueError(f"no candidate meets the latency SLO of {slo:g} ms: {seen}; "
                         "measure at a smaller batch or concurrency, or relax the SLO")
    _, choice, n, total = best
    return RightSizing(choice, n, total, options)


# -- MIG ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile (NVIDIA MIG User Guide, "Supported MIG Profiles")."""

    gpu: str
    name: str  # as nvidia-smi prints it after "MIG ": "1g.5gb", "3g.40gb", "1g.10gb+me"
    compute_slices: int  # of 7 (the "Ng")
    memory_slices: int  # of 8
    memory_gb: float  # nominal, from the profile name; nvidia-smi mig -lgip shows a little less usable
    max_instances: int  # of this profile on one GPU
    media_extensions: bool = False

    @property
    def compute_fraction(self) -> float:
        """Fraction of the GPU's SMs (N/7)."""
        return self.compute_slices / 7

    @property
    def memory_fraction(self) -> float:
        return self.memory_slices / 8


def _mig(gpu: str, rows: list[tuple]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(gpu, name, c, m, gb, n, name.endswith("+me")) for name, c, m, gb, n in rows)


# (name, compute slices of 7, memory slices of 8, GB, instances per GPU). The guide's A100-40GB
# table prints 1/8 memory for 1g.10gb; its name and nvidia-smi mig -lgip (1g.20gb on an 80 GB
# card: 19.50 GiB, the same as 2g.20gb) give two eighths, which is what is used here.
_MIG_80GB = [("1g.10gb", 1, 1, 10, 7), ("1g.10gb+me", 1, 1, 10, 1), ("1g.20gb", 1, 2, 20, 4),
             ("2g.20gb", 2, 2, 20, 3), ("3g.40gb", 3, 4, 40, 2), ("4g.40gb", 4, 4, 40, 1), ("7g.80gb", 7, 8, 80, 1)]
MIG_PROFILES: dict[str, tuple[MigProfile, ...]] = {
    "A100-40GB": _mig("A100-40GB", [("1g.5gb", 1, 1, 5, 7), ("1g.5gb+me", 1, 1, 5, 1), ("1g.10gb", 1, 2, 10, 4),
                                    ("2g.10gb", 2, 2, 10, 3), ("3g.20gb", 3, 4, 20, 2), ("4g.20gb", 4, 4, 20, 1),
                                    ("7g.40gb", 7, 8, 40, 1)]),
    "A100-80GB": _mig("A100-80GB", _MIG_80GB),
    "H100-80GB": _mig("H100-80GB", _MIG_80GB),
}
MIG_SOURCE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"
_MIG_ALIASES = {"A100-80GB-PCIe": "A100-80GB", "H100-SXM": "H100-80GB", "H100-PCIe": "H100-80GB"}


def mig_profiles(gpu: str) -> tuple[MigProfile, ...]:
    """MIG profiles of ``gpu``: a table key, a ``utils.device.hardware`` spec name (``"H100-SXM"``)
    or a device name as CUDA reports it (``"NVIDIA A100-SXM4-80GB"``)."""
    key = _MIG_ALIASES.get(gpu, gpu)
    if key not in MIG_PROFILES:
        from utils.device.hardware import spec_for_name

        spec = spec_for_name(gpu)
        key = _MIG_ALIASES.get(spec.name, spec.name) if spec else key
    if key not in MIG_PROFILES:
        raise ValueError(f"no MIG profiles for {gpu!r}; known: {', '.join(MIG_PROFILES)} "
                         "(T4, L4 and A10 have no MIG: share them by time-slicing)")
    return MIG_PROFILES[key]


def mig_profile(gpu: str, name: str) -> MigProfile:
    """One profile by name (``"3g.40gb"``; a leading ``"MIG "`` is ignored)."""
    want = name.removeprefix("MIG ").strip().lower()
    profiles = mig_profiles(gpu)
    for p in profiles:
        if p.name == want:
            return p
    raise ValueError(f"{gpu} has no MIG profile {name!r}; it has: {', '.join(p.name for p in profiles)}")


def smallest_mig_profile(gpu: str, memory_gb: float, compute_fraction: float = 0.0) -> MigProfile:
    """The smallest profile (fewest compute slices, then least memory) with at least
    ``memory_gb`` and ``compute_fraction`` of the SMs; ``+me`` profiles are skipped. The
    memory compared is the nominal size in the name: leave headroom for the few hundred MB
    that nvidia-smi shows missing (9.50-9.75 GiB usable of a 1g.10gb)."""
    need = _non_negative("memory_gb", memory_gb)
    fits = [p for p in mig_profiles(gpu)
            if not p.media_extensions and p.memory_gb >= need and p.compute_fraction >= compute_fraction]
    if not fits:
        raise ValueError(f"no {gpu} MIG profile has {need:g} GB and {compute_fraction:.2f} of the SMs: "
                         "use the whole GPU or a larger one")
    return min(fits, key=lambda p: (p.compute_slices, p.memory_slices))


def mig_gpus_needed(gpu: str, profile: str, n_instances: int) -> int:
    """GPUs to host ``n_instances`` of one profile: ``ceil(n / instances per GPU)``."""
    p = mig_profile(gpu, profile)
    return math.ceil(validate.positive_int("n_instances", n_instances) / p.max_instances)


def mig_usd_per_instance_hour(gpu_usd_per_hour: float, gpu: str, profile: str) -> float:
    """Price of one instance when the GPU is filled with this profile: GPU price / instances
    per GPU (a 3g.40gb costs half the card: only two fit, and one slice stays idle)."""
    return _positive("gpu_usd_per_hour", gpu_usd_per_hour) / mig_profile(gpu, profile).max_instances


# -- time-slicing -------------------------------------------------------------------------

@dataclass(frozen=True)
class TimeSlicing:
    n_processes: int
    time_share: float  # each process's share of GPU time, about 1/N (context switches cost extra)
    total_memory_gb: float
    gpu_memory_gb: float
    fits: bool
    headroom_gb: float  # gpu_memory_gb - total_memory_gb (negative: it does not fit)


def time_slicing(process_memory_gb: Sequence[float], gpu_memory_gb: float) -> TimeSlicing:
    """N processes sharing one GPU by time-slicing (the k8s device plugin's
    ``sharing.timeSlicing`` replicas, or several processes on one card).

    Each gets about 1/N of the GPU's time, so at best 1/N of its solo throughput; memory is
    NOT isolated or divided: every process keeps its own allocations (and a CUDA context
    of a few hundred MB) resident, so the sum must fit in the card, and one process that
    grows can make another fail with out-of-memory. MIG is the option that isolates memory.
    """
    mems = [_non_negative("process memory (GB)", m) for m in process_memory_gb]
    if not mems:
        raise ValueError("time_slicing needs the memory of at least one process")
    cap = _positive("gpu_memory_gb", gpu_memory_gb)
    total = sum(mems)
    return TimeSlicing(len(mems), 1 / len(mems), total, cap, total <= cap, cap - total)
