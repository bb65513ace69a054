"""utils.serve with a real engine: ``transformers serve`` on the CPU, the tiny Llama preset.

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

from utils import loadgen, serve

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
    marker = {"dtype": "bf16", "max_position_embeddings": 2048}
    cmd = serve.engine_command("transformers", serve.Path("/m"), marker, host="127.0.0.1", port=9, device="cuda",
                               quantization="bnb-4bit", continuous_batching=True, kv_cache_tokens=1000,
                               gpu_memory_fraction=0.5)
    assert cmd[1:5] == ["-m", "transformers.cli.transformers", "serve", "/m"]
    joined = " ".join(cmd)
    assert "--continuous-batching --cb-num-blocks 4 --cb-max-batch-tokens 1000" in joined
    assert "--quantization bnb-4bit" in joined
    assert "--dtype bfloat16" in joined and "--device cuda" in joined
    seq = serve.engine_command("transformers", serve.Path("/m"), marker, host="h", port=9, device="cpu", quantization=None,
                               continuous_batching=False, kv_cache_tokens=1000, gpu_memory_fraction=0.5)
    assert "--continuous-batching" not in seq and "--cb-num-blocks" not in seq and "--quantization" not in seq
    v = " ".join(serve.engine_command("vllm", serve.Path("/m"), marker, host="h", port=9, device="cuda",
                                      quantization="fp8", continuous_batching=True, kv_cache_tokens=None,
                                      gpu_memory_fraction=0.45))
    assert "vllm.entrypoints.openai.api_server --model /m --served-model-name /m" in v
    assert "--max-model-len 2048 --gpu-memory-utilization 0.45 --quantization fp8" in v


def test_serves_exact_lengths_to_loadgen(server):
    assert server.alive() and server.engine == "transformers" and server.continuous_batching
    fields = server.workload_fields()
    assert fields["base_url"] == server.base_url and fields["model"] == str(server.model_dir)
    w = loadgen.Workload(**fields, num_requests=6, input_len=16, output_len=12, concurrency=3)
    r = loadgen.run(w, progress=False)
    assert r["completed"] == 6 and r["failed"] == 0, r["failures"]
    for req in r["requests"]:
        assert req["output_tokens"] == 12 and req["tokens_from_usage"]
        assert len(req["itl_s"]) == 11  # every token streamed as its own text chunk
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
    with pytest.raises(serve.ServeError, match="not a model directory from utils.serve.build_model_dir"):
        serve.start(tmp_path)
    with pytest.raises(serve.ServeError, match="unknown preset 'llama-7b'"):
        serve.build_model_dir("llama-7b", root=tmp_path)


def test_vllm_missing_is_reported():
    ok, why = serve.engine_available("vllm")
    assert not ok and "vLLM" in why  # not installed on the CPU test machine (and it needs a GPU)


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
    assert "\n" not in msg and "its log ends:" in msg and str(tmp_path) in msg
    assert spawned and all(p.poll() is not None for p in spawned)


def test_start_timeout_stops_the_engine(model_dir, tmp_path, spawned):
    with pytest.raises(serve.ServeError, match=r"did not answer /health within 0.5 s"):
        serve.start(model_dir, engine="transformers", device="cpu", timeout_s=0.5, log_dir=tmp_path)
    assert len(spawned) == 1 and spawned[0].poll() is not None


def test_engine_dies_with_its_parent(model_dir, tmp_path):
    """setpriv --pdeathsig: a kernel killed with SIGKILL takes its engine with it."""
    if not serve.shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed here")
    code = (f"import sys, time; sys.path.insert(0, {str(serve.Path(serve.__file__).parent.parent)!r})\n"
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
                                    log_path=tmp_path / "engine.log", log_tail=lambda: "")
        proc = types.SimpleNamespace(poll=lambda: None, returncode=None)
        if error is None:
            serve._wait_ready(srv, proc, time.perf_counter(), 10.0)
        else:
            with pytest.raises(serve.ServeError, match=error):
                serve._wait_ready(srv, proc, time.perf_counter(), 10.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
