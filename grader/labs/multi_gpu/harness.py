"""Lab 02's harnesses: course code that runs the learner's definitions inside a sandbox.

Each function here runs in a sandbox process that holds the learner's definitions (``ns``), never
in the grader's process (``grader/sandbox.py``). What it returns is plain data and, since the
learner's code ran beside it, a claim: the judges (``judges.py``) check every number they use
against the grader's own computation from the inputs they drew.

- :func:`memory_predictions`: ``memory_per_gpu_gb`` at the size of a stack of layers the grader drew
  (its own sharded run of that stack is the judge's, after this harness).
- :func:`grad_sync`: the learner's three gradient synchronizations on several ranks. This process
  is rank 0; the other ranks are processes it starts (:func:`rank_main`), which import the
  learner's cell as a module (``utils.parallel.grad_sync.write_answer_module``). Every rank trains the same
  model from weights drawn from the grader's seed, on batches drawn from it, once per version and
  step; each (version, step) is one section the grader times from outside (``clock.go`` on rank 0,
  then every rank starts; ``clock.done`` once every rank's gradients are summed up). A section's
  outputs are every rank's gradients as weighted sums (:func:`checksums`, weights drawn from the
  seed), which the judge recomputes with its own model. The model, batches and weights are drawn from
  the secret seed the grader passes in ``params`` (drawn after the notebook's kernel is gone); every
  step's batches differ, so a version that caches a result fails the next step's check.
- :func:`fused_kernel` and :func:`second_fusion`: the learner's Triton kernels on inputs drawn
  from the grader's seed. Each launch of the kernel object is counted (``kernel.run`` is what
  ``kernel[grid](...)`` calls), the tensors it was given are noted (the output must be one of
  them), and the PyTorch operations the launcher calls are counted (``TorchFunctionMode``). On a
  GPU the kernels are timed in sections the grader times from outside, each on inputs drawn from
  the section's own go seed; the section's output's weighted sum is recomputed by the judge from the
  seed the grader sent (``Section.seed``).
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# PyTorch calls a launcher may make without computing anything: allocation, layout, metadata
LAYOUT_OPS = frozenset((
    "__get__", "__set__", "size", "dim", "numel", "element_size", "is_contiguous", "contiguous", "stride", "data_ptr",
    "__len__", "__repr__", "__format__", "empty", "empty_like", "zeros", "zeros_like", "empty_strided", "view",
    "reshape", "flatten", "view_as", "reshape_as", "__index__", "__int__", "__bool__", "storage_offset", "untyped_storage",
    "is_floating_point", "get_device", "nelement", "ndimension", "type", "cpu", "cuda", "to", "numpy", "detach",
    "__array__", "_is_view", "is_complex", "requires_grad_", "__hash__", "__eq__", "new_empty", "unsqueeze", "squeeze",
    "expand", "as_strided", "t", "__getitem__", "item", "tolist", "clone", "copy_", "__reduce_ex__", "__deepcopy__",
    "__setstate__", "_typed_storage", "storage"))
# the learner's fusion's unfused PyTorch version: ops that are not computation (they do not count towards "two or more")
NOT_COMPUTE = LAYOUT_OPS


# -- memory per GPU against the grader's sharded run ---------------------------------------------------

def memory_predictions(ns: dict, params: dict, clock) -> list:
    """``memory_per_gpu_gb(*case)`` for each case of ``params["cases"]``: ``{"ok": value}`` or ``{"error": ...}``."""
    fn = ns.get("memory_per_gpu_gb")
    if not callable(fn):
        raise RuntimeError("memory_per_gpu_gb is not defined by your definitions")
    out = []
    for case in params["cases"]:
        try:
            out.append({"ok": fn(*case)})
        except Exception as exc:  # the learner's function raised: the judge says so
            out.append({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]})
    return out


# -- gradient synchronization on several ranks ------------------------------------------------------

def projection_weights(named_shapes: list, seed: int, k: int) -> list:
    """``k`` weight vectors per parameter (float32, standard normal, from ``seed``), in parameter order."""
    import torch

    gen = torch.Generator().manual_seed(int(seed) * 2 + 1)
    return [torch.randn(k, int(math.prod(shape)), generator=gen) for _, shape in named_shapes]


def checksums(model, weights: list) -> list:
    """Per parameter: ``[sum(grad * w_j) for j]`` and ``sum(grad^2)`` (float32 on the gradient's device); a
    parameter with no gradient gives ``None``."""
    import torch

    out = []
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights, strict=True):
            if p.grad is None:
                out.append(None)
                continue
            g = p.grad.detach().reshape(-1).float()
            out.append([*(w @ g).tolist(), float(g.dot(g))])
    return out


def batch(cfg: dict, step: int, rank: int, vocab: int):
    """Rank ``rank``'s token batch of ``step``, drawn from the run's seed (CPU generator: the same on every device)."""
    import torch

    g = torch.Generator().manual_seed(int(cfg["seed"]) * 7919 + step * 131 + rank)
    return torch.randint(0, vocab, (cfg["batch"], cfg["seq"]), generator=g)


def build_base(cfg: dict, device):
    """The run's model: built on the CPU from the seed (the same weights on every device), eval mode (no dropout)."""
    import torch

    from utils.model.models import build_model

    torch.manual_seed(int(cfg["seed"]))
    model = build_model(cfg["preset"]).eval()
    model.config.use_cache = False
    return model.to(device)


class _RankControl:
    """How a rank starts and ends a section: rank 0 asks the grader's clock; every rank then starts at
    once (a broadcast), and rank 0 hands the gathered outputs to the clock."""

    def __init__(self, clock, rank: int, device):
        self.clock, self.rank, self.device = clock, rank, device

    def go(self, label: str) -> None:
        import torch
        import torch.distributed as dist

        token = torch.zeros(1, dtype=torch.int64, device=self.device)
        if self.rank == 0:
            token += self.clock.go(label) % (2**31)
        dist.broadcast(token, 0)

    def done(self, label: str, outputs) -> None:
        if self.rank == 0:
            self.clock.done(label, outputs)


def run_versions(answer, cfg: dict, device, control, counter) -> dict:
    """Every rank's part: the run's versions, step by step, each (version, step) one section (see the
    module docstring). Rank 0 returns the run's shape; the sections carry the checksums."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from utils.parallel.grad_sync_harness import LearnerError, _learner

    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = device.type == "cuda"
    base = build_base(cfg, device)
    named = [(n, tuple(p.shape)) for n, p in base.named_parameters()]
    weights = [w.to(device) for w in projection_weights(named, cfg["seed"], cfg["projections"])]
    versions = list(cfg["versions"])
    models = {v: copy.deepcopy(base) for v in versions}
    del base
    ddp = DistributedDataParallel(models["ddp"], device_ids=[device.index] if on_gpu else None,
                                  bucket_cap_mb=cfg["bucket_mb"]) if "ddp" in models else None
    overlap = _learner("OverlappedSync(model)", answer.OverlappedSync, models["overlapped"]) \
        if "overlapped" in models else None
    finish = getattr(overlap, "finish", None)
    if overlap is not None and not callable(finish):
        raise LearnerError("your OverlappedSync has no finish() method")
    syncs = {"each": ("sync_each(model)", lambda m: answer.sync_each(m)),
             "bucketed": ("sync_bucketed(model, bucket_mb)", lambda m: answer.sync_bucketed(m, cfg["bucket_mb"])),
             "bucketed_check": ("sync_bucketed(model, bucket_mb)",
                                lambda m: answer.sync_bucketed(m, cfg["check_bucket_mb"])),
             "overlapped": ("OverlappedSync.finish()", lambda m: finish())}
    vocab = models[versions[0]].config.vocab_size

    def sync_device():
        if on_gpu:
            torch.cuda.synchronize(device)

    for step in range(cfg["steps"]):
        x = batch(cfg, step, rank, vocab).to(device)
        shift = (step * cfg.get("rotate", 1)) % len(versions)
        for v in versions[shift:] + versions[:shift]:
            m = models[v]
            m.zero_grad(set_to_none=True)
            label = f"{v}/{step}"
            control.go(label)
            learner = v in syncs
            counter.calls, counter.active = [], learner
            loss = (ddp if v == "ddp" else m)(input_ids=x, labels=x).loss
            counter.in_backward = True
            if v == "overlapped":
                _learner("OverlappedSync gradient hook", loss.backward)
            else:
                loss.backward()
            counter.in_backward = False
            if learner:
                what, fn = syncs[v]
                _learner(what, fn, m)
            sync_device()
            counter.active = False
            mine = checksums(m, weights)
            gathered = [None] * world
            dist.all_gather_object(gathered, {"sums": mine, "calls": counter.stats() if learner else None})
            control.done(label, {"sums": [g["sums"] for g in gathered], "calls": [g["calls"] for g in gathered]})
    params = list(models[versions[0]].parameters())
    return {"world_size": world, "params": [n for n, _ in named], "shapes": [list(s) for _, s in named],
            "grad_bytes": sum(p.numel() * p.element_size() for p in params),
            "largest_grad_bytes": max(p.numel() * p.element_size() for p in params)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_group(cfg: dict, rank: int):
    """This rank's process group and device, as ``benchmarks/grad_sync.py`` sets them up."""
    import datetime

    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=cfg["collective_timeout_s"])
    init = f"tcp://127.0.0.1:{cfg['port']}"
    if cfg["backend"] == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=cfg["world"], timeout=timeout,
                                device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, min(8, (os.cpu_count() or 2) // cfg["world"])))
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=cfg["world"], timeout=timeout)
    return device


class _NoClock:
    def go(self, label):
        return 0

    def done(self, label, outputs):
        pass


def rank_main() -> None:
    """A rank other than 0 (started by :func:`grad_sync`): its config is one JSON line on stdin; a
    failure of the learner's code is written to its error file and ends the process."""
    cfg = json.loads(sys.stdin.readline())
    rank = int(cfg["rank"])
    err = Path(cfg["error_file"])
    from utils.parallel.grad_sync_harness import LearnerError, _Counter, load_answer

    try:
        import torch.distributed as dist

        device = _init_group(cfg, rank)
        counter = _Counter()
        counter.install(dist)
        answer = load_answer(cfg["answer"])
        run_versions(answer, cfg, device, _RankControl(_NoClock(), rank, device), counter)
    except LearnerError as exc:
        err.write_text(str(exc))
        os._exit(3)
    except BaseException as exc:  # a peer stopped, or the grader's own code failed
        err.write_text(f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        os._exit(4)
    sys.stdout.flush()
    os._exit(0)  # no teardown: gloo's threads can abort an exiting interpreter (utils.parallel.distributed.exit_without_teardown)


def grad_sync(ns: dict, params: dict, clock) -> dict:
    """The learner's ``sync_each``, ``sync_bucketed`` and ``OverlappedSync`` on ``params["world"]`` ranks
    (this process is rank 0), against no synchronization and PyTorch's DDP (see the module docstring).
    ``params``: the run's config (``backend``, ``world``, ``preset``, ``batch``, ``seq``, ``steps``,
    ``bucket_mb``, ``check_bucket_mb``, ``seed``, ``projections``, ``versions``)."""
    if params.get("skip"):
        return {"skipped": params["skip"]}
    import torch.distributed as dist

    from utils.parallel.grad_sync import NAMES, write_answer_module
    from utils.parallel.grad_sync_harness import LearnerError, _Counter, load_answer
    from utils.parallel.launch import MULTICAST_OFF

    missing = [n for n in NAMES.values() if not callable(ns.get(n))]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not defined by your definitions")
    work = Path(tempfile.mkdtemp(prefix="gpulab-sync-"))
    try:
        path = write_answer_module(work / "sync_answer.py", *(ns[n] for n in NAMES.values()))
    except (ValueError, TypeError) as exc:
        raise RuntimeError(f"your sync functions cannot be run on several ranks: {exc}") from None
    cfg = dict(params, port=_free_port(), answer=str(path))
    for k, v in MULTICAST_OFF:  # NVLink multicast off in every rank, this one too (utils.parallel.launch.launch_env says why)
        os.environ.setdefault(k, v)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if cfg["backend"] == "gloo":
        env["CUDA_VISIBLE_DEVICES"] = ""
    procs, errors = [], []
    for r in range(1, cfg["world"]):
        errors.append(work / f"rank{r}.err")
        log = open(work / f"rank{r}.log", "wb")  # noqa: SIM115 - closed when the rank is reaped
        p = subprocess.Popen([sys.executable, "-c", "from grader.labs.multi_gpu.harness import rank_main; rank_main()"],
                             stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(work))
        p.stdin.write((json.dumps(dict(cfg, rank=r, error_file=str(errors[-1]))) + "\n").encode())
        p.stdin.close()
        procs.append((p, log))

    def reap(wait_s: float) -> None:
        for p, log in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=wait_s)
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()

    def rank_errors() -> str:
        reap(3)  # a rank that failed has written its error file and exited; one blocked in a collective is stopped
        said = [e.read_text().strip() for e in errors if e.is_file() and e.read_text().strip()]
        return "; ".join(said)

    try:
        device = _init_group(cfg, 0)
        counter = _Counter()
        counter.install(dist)
        answer = load_answer(path)
        result = run_versions(answer, cfg, device, _RankControl(clock, 0, device), counter)
    except LearnerError as exc:
        reap(0)
        raise RuntimeError(str(exc)) from None
    except Exception as exc:
        other = rank_errors()
        raise RuntimeError(other or f"rank 0: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") \
            from None
    finally:
        reap(30)
        shutil.rmtree(work, ignore_errors=True)
    return result


# -- the Triton kernels ---------------------------------------------------------------------------

def _kernel_kind(kernel) -> str:
    """``"jit"``, ``"interpreted"`` or what the object is instead."""
    name = type(kernel).__name__
    if name == "JITFunction" and type(kernel).__module__.startswith("triton"):
        return "jit"
    if name == "InterpretedFunction" and type(kernel).__module__.startswith("triton"):
        return "interpreted"
    return name


class _Launches:
    """Counts launches of ``kernel`` (``kernel[grid](...)`` calls ``kernel.run``) while active, and
    notes the data pointers of the tensors each launch was given."""

    def __init__(self, kernel):
        self.kernel, self.count, self.pointers = kernel, 0, set()

    def __enter__(self):
        import torch

        original = type(self.kernel).run

        def run(*args, **kwargs):
            if not kwargs.get("warmup"):
                self.count += 1
                for a in list(args) + list(kwargs.values()):
                    if isinstance(a, torch.Tensor):
                        self.pointers.add(a.data_ptr())
            return original(self.kernel, *args, **kwargs)

        self.kernel.run = run  # an instance attribute shadows the class's method; removed on exit
        return self

    def __exit__(self, *exc):
        self.kernel.__dict__.pop("run", None)


class _TorchOps:
    """The PyTorch functions and tensor methods called inside (``torch.overrides.TorchFunctionMode``)."""

    def __init__(self):
        from torch.overrides import TorchFunctionMode

        ops = self.ops = []

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                ops.append(getattr(func, "__name__", str(func)))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    def compute(self) -> list:
        return sorted({op for op in self.ops if op not in LAYOUT_OPS})


def _device(params: dict):
    import torch

    return torch.device(params["device"])


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def inputs(seed: int, rows: int, cols: int, device, dtype, extra: int = 0):
    """``x`` (rows x cols, 3 x standard normal: GELU's curved part and its tails) and ``bias`` (cols),
    drawn on the CPU from ``seed`` (the same values wherever they are used), then ``extra`` more
    (rows x cols) tensors, on ``device`` in ``dtype``."""
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    x = 3 * torch.randn(rows, cols, generator=gen)
    bias = torch.randn(cols, generator=gen)
    more = [torch.randn(rows, cols, generator=gen) for _ in range(extra)]
    return [t.to(device=device, dtype=dtype) for t in (x, bias, *more)]


def device_inputs(seed: int, rows: int, cols: int, device, dtype, extra: int = 0):
    """As :func:`inputs`, drawn on ``device`` itself (a timed section draws them: fast on a GPU)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(int(seed))
    x = 3 * torch.randn(rows, cols, generator=gen, device=device)
    bias = torch.randn(cols, generator=gen, device=device)
    more = [torch.randn(rows, cols, generator=gen, device=device) for _ in range(extra)]
    return [t.to(dtype) for t in (x, bias, *more)]


def weighted_sum(out, seed: int, absolute: bool = False) -> float:
    """``sum(out * w)`` (or of their absolute values) with ``w`` drawn on ``out``'s device from ``seed``; read
    back to the host, so the device has finished."""
    import torch

    gen = torch.Generator(device=out.device).manual_seed(int(seed) + 1)
    w = torch.randn(out.numel(), generator=gen, device=out.device)
    prod = out.detach().reshape(-1).float() * w
    return float((prod.abs() if absolute else prod).sum().item())


def _values(t) -> list:
    return t.detach().float().cpu().reshape(-1).tolist()


def _call_launcher(fn, kernel, args: tuple) -> dict:
    """``fn(*args)`` with the kernel's launches and PyTorch's operations counted."""
    import torch

    with _Launches(kernel) as launched, _TorchOps() as ops:
        try:
            out = fn(*args)
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
    if not isinstance(out, torch.Tensor):
        return {"error": f"it returned {type(out).__name__}, not a tensor", "launches": launched.count}
    return {"launches": launched.count, "torch_ops": ops.compute(), "out_launched": out.data_ptr() in launched.pointers,
            "shape": list(out.shape), "dtype": str(out.dtype).removeprefix("torch."),
            "is_input": any(isinstance(a, torch.Tensor) and a.data_ptr() == out.data_ptr() for a in args),
            "values": _values(out)}


def _timed_sections(clock, label: str, reps: int, calls: int, make, run) -> None:
    """``reps`` sections timed by the grader: each on inputs drawn from its own seed (``make(seed)``),
    ``calls`` runs of ``run(*inputs)``, then the last output's weighted sum (:func:`weighted_sum`)."""
    for r in range(reps):
        name = f"{label}/{r}" if reps > 1 else label
        seed = clock.go(name)
        args = make(seed)
        out = None
        for _ in range(calls):
            out = run(*args)
        clock.done(name, {"seed": int(seed), "checksum": weighted_sum(out, seed)})


def fused_kernel(ns: dict, params: dict, clock) -> dict:
    """The learner's ``fused_bias_gelu`` launching ``BIAS_GELU_KERNEL`` on ``params["cases"]`` (rows,
    cols, dtype, seed each); on a GPU (``params["time"]``) also timed in sections, the grader's
    unfused ops timed the same way by the grader (``reference.py``)."""
    kernel, fn = ns.get("BIAS_GELU_KERNEL"), ns.get("fused_bias_gelu")
    out = {"kind": _kernel_kind(kernel), "defined": callable(fn), "cases": []}
    if out["kind"] not in ("jit", "interpreted") or not callable(fn):
        return out
    device = _device(params)
    for rows, cols, dtype, seed in params["cases"]:
        x, bias = inputs(seed, rows, cols, device, _dtype(dtype))
        out["cases"].append(_call_launcher(fn, kernel, (x, bias)))
    t = params.get("time")
    if t:
        rows, cols = t["shape"]
        dt = _dtype(t["dtype"])
        fn(*device_inputs(0, rows, cols, device, dt))  # compiled and warm before the first timed section
        _timed_sections(clock, "fused", t["reps"], t["calls"], lambda s: device_inputs(s, rows, cols, device, dt), fn)
    return out


def second_fusion(ns: dict, params: dict, clock) -> dict:
    """The learner's own fusion: ``second_inputs`` (after ``torch.manual_seed`` of each case's seed),
    ``second_unfused`` with its PyTorch operations counted, ``second_fused`` launching
    ``SECOND_KERNEL`` with its launches counted, ``second_bytes``; on a GPU both versions timed in
    alternating sections."""
    import torch

    kernel, first = ns.get("SECOND_KERNEL"), ns.get("BIAS_GELU_KERNEL")
    names = ("second_fused", "second_unfused", "second_inputs", "second_bytes")
    missing = [n for n in names if not callable(ns.get(n))]
    out = {"kind": _kernel_kind(kernel), "missing": missing, "cases": [],
           "same_kernel": kernel is first or (getattr(kernel, "fn", None) is not None and getattr(first, "fn", None)
                                              is not None and (kernel.fn is first.fn or getattr(kernel.fn, "__code__", 1)
                                                               == getattr(first.fn, "__code__", 2)))}
    if missing or out["kind"] not in ("jit", "interpreted"):
        return out
    fused, unfused, make, nbytes = (ns[n] for n in names)
    device = _device(params)
    for rows, cols, dtype, seed in params["cases"]:
        case: dict = {}
        try:
            torch.manual_seed(int(seed))
            args = make(rows, cols, device, _dtype(dtype))
        except Exception as exc:
            case["error"] = f"second_inputs raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            out["cases"].append(case)
            continue
        if not isinstance(args, tuple) or not args or not all(isinstance(a, torch.Tensor) for a in args):
            case["error"] = f"second_inputs must return a tuple of tensors, got {type(args).__name__}"
            out["cases"].append(case)
            continue
        case["inputs"] = [[list(a.shape), str(a.dtype).removeprefix("torch."), str(a.device.type)] for a in args]
        with _TorchOps() as ops:
            try:
                want = unfused(*args)
            except Exception as exc:
                want = exc
        if isinstance(want, BaseException) or not isinstance(want, torch.Tensor):
            case["error"] = (f"second_unfused raised {type(want).__name__}: {want}" if isinstance(want, BaseException)
                             else f"second_unfused returned {type(want).__name__}, not a tensor")
            out["cases"].append(case)
            continue
        case["unfused_ops"] = [op for op in ops.ops if op not in NOT_COMPUTE]
        case["unfused_copies_input"] = any(a.shape == want.shape and a.dtype == want.dtype and torch.equal(a, want)
                                           for a in args)
        case["unfused"] = _values(want)
        case["unfused_dtype"] = str(want.dtype).removeprefix("torch.")
        case["fused"] = _call_launcher(fused, kernel, args)
        out["cases"].append(case)
    try:
        moved = nbytes(*params["bytes_case"])
        out["bytes"] = {k: moved[k] for k in ("unfused", "fused")} if isinstance(moved, dict) else repr(moved)[:80]
    except Exception as exc:
        out["bytes"] = f"second_bytes raised {type(exc).__name__}: {exc}"[:200]
    t = params.get("time")
    if t:
        rows, cols = t["shape"]
        dt = _dtype(t["dtype"])

        def make_seeded(seed):
            torch.manual_seed(int(seed))
            return make(rows, cols, device, dt)

        fused(*make_seeded(0))
        unfused(*make_seeded(0))
        for r in range(t["reps"]):  # alternating, each on inputs of its own seed
            _timed_sections(clock, f"unfused/{r}", 1, t["calls"], make_seeded, unfused)
            _timed_sections(clock, f"fused/{r}", 1, t["calls"], make_seeded, fused)
        torch.manual_seed(int(t["check_seed"]))
        args = make(rows, cols, device, dt)
        a, b = unfused(*args), fused(*args)
        out["timed_agree"] = {"max_abs": float((a.float() - b.float()).abs().max().item()),
                              "scale": float(a.float().abs().max().item())}
    return out
