"""The fast decode path with and without Inductor's coordinate-descent tuning (issue 6's 40% goal).

    python benchmarks/decode_tuning.py OUT.json        # on a CUDA GPU: Llama-1.1B shape, bf16, batch 1

``utils.decode.FastDecoder`` (static KV cache, fused QKV and gate/up, one CUDA graph per
token) is built twice over the same random-weight model, once with Inductor's defaults and
once with ``torch._inductor.config.coordinate_descent_tuning = True`` (gpt-fast sets it: after
picking a kernel config, Inductor searches the neighbouring block sizes of each generated
reduction kernel, which matters for the matrix-vector shapes of batch-1 decode). Compilation
takes about twice as long with it. Each is timed as ``utils.inference.measure_decode``
times it (TPOT from 1 and 64 new tokens after a 128-token prompt); ``weights_gbs`` is weight
bytes read per step x steps per second, the quantity the copy bandwidth bounds.
"""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(out: str) -> int:
    import torch

    from utils import decode, inference
    from utils.models import build_model

    if not torch.cuda.is_available():
        print("decode_tuning.py: error: needs a CUDA GPU (it measures compiled CUDA graphs)", file=sys.stderr)
        return 2
    res: dict = {}
    torch.manual_seed(0)
    model = build_model("llama-1.1b", dtype="bf16", device="cuda").eval()
    prompt = torch.randint(100, 30000, (1, 128), device="cuda")
    res["copy_gbs"] = inference.measure_copy_bandwidth()["gbs"]
    wbr = inference.weight_bytes_read_per_step(model)
    for name, tune in (("default", False), ("coordinate_descent", True)):
        torch._dynamo.reset()
        torch._inductor.config.coordinate_descent_tuning = tune
        t0 = time.perf_counter()
        path = decode.warm(decode.fast_path(model, prompt, 64), 64)
        m = inference.measure_decode(path, 64)
        res[name] = {"warm_s": path.warmup_s, "tpot_ms": m["tpot_ms"], "tokens_per_s": m["tokens_per_s"],
                     "weights_gbs": wbr * m["tokens_per_s"] / 1e9, "wall_s": time.perf_counter() - t0}
        print(name, res[name], flush=True)
    Path(out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python benchmarks/decode_tuning.py OUT.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
