"""utils.model.weights and the real-weights path of utils.model.models and utils.model.model_dir, offline.

A tiny Llama is written into a temporary ``HF_HOME`` in the hub's own cache layout
(``tests/hub_cache.py``) under a repository id; with ``HF_HUB_OFFLINE=1`` the labs' loaders must
find it by that id and load those weights and that tokenizer. No test reaches the network: the
hub probe and the download are replaced wherever a test gets that far.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests import hub_cache
from utils.model import model_dir as MD
from utils.model import models as M
from utils.model import weights as W

REPO = hub_cache.TINY_REPO


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """(HF_HOME, snapshot, state dict) of the tiny Llama written once for the module."""
    home = tmp_path_factory.mktemp("hf_home")
    snap, state = hub_cache.write_tiny_llama(home)
    return home, snap, state


@pytest.fixture
def hub(cached, monkeypatch):
    """The cache as the environment's, offline, the tiny preset pointed at the cached repository;
    the hub probe and the download fail the test if reached."""
    home, snap, state = cached
    for var in ("HF_HUB_CACHE", "GPULAB_WEIGHTS", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(W.HUB_IDS_VAR, f"{hub_cache.TINY_PRESET}={REPO}")

    def refuse(*a, **k):
        raise AssertionError("the network was reached")

    monkeypatch.setattr(W, "hub_reachable", refuse)
    monkeypatch.setattr(W, "_download", refuse)
    return home, snap, state


def _same_weights(model, state) -> bool:
    got = model.state_dict()
    return set(got) == set(state) and all(torch.equal(got[k].cpu(), state[k]) for k in state)


def test_cache_has_the_hubs_layout(hub):
    home, snap, _ = hub
    repo = home / "hub" / "models--gpulab-test--tiny-llama"
    assert (repo / "refs" / "main").read_text() == snap.name and snap.parent == repo / "snapshots"
    weights = snap / "model.safetensors"
    assert weights.is_symlink() and weights.resolve().parent == repo / "blobs"
    assert W.hub_cache_dir() == home / "hub"
    assert W.cached_snapshot(REPO) == snap


def test_load_model_loads_the_cached_checkpoint_by_its_repo_id(hub, capfd):
    _, snap, state = hub
    model = M.load_model(hub_cache.TINY_PRESET)
    out, err = capfd.readouterr()
    assert out == f"{hub_cache.TINY_PRESET}: real weights {REPO} from the local hub cache\n"
    assert err == ""  # nbgrader scores a cell 0 on stderr
    assert _same_weights(model, state)
    tok = M.model_tokenizer(model)
    assert len(tok) == hub_cache.TOKENIZER_VOCAB != M.SHIPPED_VOCAB_SIZE  # the checkpoint's own tokenizer
    assert tok.decode(M.encode(tok, "the master of the school")) == "the master of the school"
    assert len(M.get_tokenizer(hub_cache.TINY_PRESET)) == hub_cache.TOKENIZER_VOCAB
    lm = M.load_causal_lm(hub_cache.TINY_PRESET, weights="pretrained")
    assert lm.weights == "pretrained" and _same_weights(lm.model, state)


def test_random_weights_when_asked(hub, monkeypatch, capsys):
    _, _, state = hub
    monkeypatch.setenv(W.WEIGHTS_VAR, "random")
    model = M.load_model(hub_cache.TINY_PRESET)
    assert capsys.readouterr().out.startswith("llama-tiny: random weights: GPULAB_WEIGHTS=random")
    assert not _same_weights(model, state)
    assert len(M.model_tokenizer(model)) == M.SHIPPED_VOCAB_SIZE
    assert len(M.get_tokenizer(hub_cache.TINY_PRESET)) == M.SHIPPED_VOCAB_SIZE
    with pytest.raises(ValueError, match="no real weights for 'llama-tiny': GPULAB_WEIGHTS=random"):
        M.load_causal_lm(hub_cache.TINY_PRESET, weights="pretrained")


def test_offline_without_the_checkpoint_is_random_and_says_so(hub, monkeypatch):
    monkeypatch.setenv(W.HUB_IDS_VAR, "llama-tiny=gpulab-test/absent")
    lm = M.load_causal_lm("llama-tiny")
    assert lm.weights == "random"
    assert lm.line.startswith("llama-tiny: random weights: offline (HF_HUB_OFFLINE=1) and gpulab-test/absent")
    monkeypatch.delenv(W.HUB_IDS_VAR)  # a smoke preset has no checkpoint of its own
    assert "smoke-size shape with no checkpoint" in M.load_causal_lm("llama-tiny").line
    # a full preset offline with an empty cache: random, and its shipped config builds it
    choice = M.choose_weights("llama-1.1b")
    assert not choice.real and choice.hub_id == "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    assert choice.reason.startswith("offline (HF_HUB_OFFLINE=1)")


def test_unreachable_hub_and_failed_download_are_one_line(hub, monkeypatch, capfd):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv(W.HUB_IDS_VAR, "llama-tiny=gpulab-test/absent")
    monkeypatch.setattr(W, "hub_reachable", lambda: False)
    assert "the hub at https://huggingface.co is unreachable" in M.choose_weights("llama-tiny").reason
    assert M.choose_weights("llama-tiny", download=False).reason == "gpulab-test/absent is not in the local hub cache"

    def broken(hub_id):
        raise OSError("Connection reset by peer\n(retrying)")

    monkeypatch.setattr(W, "hub_reachable", lambda: True)
    monkeypatch.setattr(W, "_download", broken)
    model = M.load_model("llama-tiny")
    out, err = capfd.readouterr()
    assert out == ("llama-tiny: random weights: downloading gpulab-test/absent failed (OSError: Connection reset "
                   "by peer (retrying)) (honest for speed and memory, not for text)\n")
    assert err == "" and model.gpulab_weights.kind == "random"


def test_a_download_lands_in_the_cache_and_loads(hub, monkeypatch, capsys):
    home, _, state = hub
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv(W.HUB_IDS_VAR, "llama-tiny=gpulab-test/fresh")
    fetched = []

    def download(hub_id):  # what snapshot_download leaves behind: the same layout
        fetched.append(hub_id)
        return hub_cache.write_snapshot(home, hub_id, {p.name: p.read_bytes() for p in W.cached_snapshot(REPO).iterdir()})

    monkeypatch.setattr(W, "hub_reachable", lambda: True)
    monkeypatch.setattr(W, "_download", download)
    model = M.load_model("llama-tiny")
    assert capsys.readouterr().out == "llama-tiny: real weights gpulab-test/fresh from the hub\n"
    assert fetched == ["gpulab-test/fresh"] and _same_weights(model, state)
    M.load_model("llama-tiny")  # now cached: no second download
    assert fetched == ["gpulab-test/fresh"]


def test_incomplete_or_corrupt_checkpoints_fall_back(hub, monkeypatch, capfd):
    home, snap, _ = hub
    config = (snap / "config.json").read_bytes()
    hub_cache.write_snapshot(home, "gpulab-test/no-weights", {"config.json": config})
    index = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                       "b": "model-00002-of-00002.safetensors"}}).encode()
    hub_cache.write_snapshot(home, "gpulab-test/half-sharded", {"config.json": config, "model.safetensors.index.json": index,
                                                                "model-00001-of-00002.safetensors": b"x"})
    for repo in ("gpulab-test/no-weights", "gpulab-test/half-sharded"):
        assert W.cached_snapshot(repo) is None
        monkeypatch.setenv(W.HUB_IDS_VAR, f"llama-tiny={repo}")
        assert not M.choose_weights("llama-tiny").real
    hub_cache.write_snapshot(home, "gpulab-test/corrupt", {"config.json": config, "model.safetensors": b"not weights"})
    monkeypatch.setenv(W.HUB_IDS_VAR, "llama-tiny=gpulab-test/corrupt")
    lm = M.load_causal_lm("llama-tiny")
    assert lm.weights == "random" and lm.line.startswith("llama-tiny: random weights: loading gpulab-test/corrupt failed (")
    assert "\n" not in lm.line and capfd.readouterr().err == ""


def test_settings_are_checked_and_read_at_each_call(monkeypatch, tmp_path):
    monkeypatch.setenv(W.WEIGHTS_VAR, "sometimes")
    with pytest.raises(ValueError, match="GPULAB_WEIGHTS='sometimes' is not one of auto, random"):
        W.weights_mode()
    monkeypatch.setenv(W.WEIGHTS_VAR, " Random ")
    assert W.weights_mode() == "random"
    for bad in ("llama-tiny", "llama-tiny=noslash", "=org/name", "llama-tiny=org/"):
        monkeypatch.setenv(W.HUB_IDS_VAR, bad)
        with pytest.raises(ValueError, match="is not preset=org/name"):
            W.hub_id_overrides()
    monkeypatch.setenv(W.HUB_IDS_VAR, " llama-tiny = a/b , gpt2-tiny=c/d,")
    assert W.hub_id_overrides() == {"llama-tiny": "a/b", "gpt2-tiny": "c/d"}
    assert W.hub_id_for("qwen-tiny", None) is None and W.hub_id_for("llama-tiny", "x/y") == "a/b"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert W.hub_cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("HF_HUB_CACHE")
    assert W.hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert W.hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


def test_served_directory_links_the_cached_checkpoint(hub, tmp_path, capsys):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    _, snap, state = hub
    d = MD.build_model_dir("llama-tiny", "fp32", root=tmp_path, device="cpu")
    assert capsys.readouterr().out == f"llama-tiny: real weights {REPO} from the local hub cache\n"
    marker = MD.read_marker(d)
    assert marker["preset"] == "llama-tiny" and marker["weights"] == "real" and marker["hub_id"] == REPO
    params = sum(t.numel() for t in state.values())  # llama-tiny's head is untied: every tensor is stored
    assert marker["params"] == params and marker["weight_bytes"] == 4 * params
    assert marker["vocab_size"] == marker["tokenizer_size"] == hub_cache.TOKENIZER_VOCAB
    assert marker["revision"] == snap.name and marker["allowed_token_ids"] is None
    assert (d / "model.safetensors").resolve() == (snap / "model.safetensors").resolve()  # the cache's own bytes
    assert (d / "tokenizer.json").resolve() == (snap / "tokenizer.json").resolve()
    gen, cfg = GenerationConfig.from_pretrained(d), AutoConfig.from_pretrained(d)
    tok = AutoTokenizer.from_pretrained(d)
    assert gen.eos_token_id is None and cfg.eos_token_id is None and not gen.do_sample
    assert set(gen.suppress_tokens) == set(tok.all_special_ids) and len(tok) == hub_cache.TOKENIZER_VOCAB
    assert _same_weights(AutoModelForCausalLM.from_pretrained(d), state)
    assert MD.model_facts(d)["dtype"] == "fp32"
    assert MD.build_model_dir("llama-tiny", "bf16", root=tmp_path, device="cpu") != d  # one per dtype
    assert MD.build_model_dir("llama-tiny", "fp32", root=tmp_path, device="cpu") == d  # cached
    q = MD.quantized_model_dir(d, "w8a8")  # the int8 checkpoint reads the linked weights
    assert MD.read_marker(q)["preset"] == "llama-tiny" and MD.read_marker(q)["quantization"]["format"] == "w8a8"


def test_served_directory_is_random_offline_or_when_asked(hub, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(W.WEIGHTS_VAR, "random")
    d = MD.build_model_dir("llama-tiny", "fp32", root=tmp_path, device="cpu")
    assert capsys.readouterr().out.startswith("llama-tiny: random weights: GPULAB_WEIGHTS=random")
    assert MD.read_marker(d)["weights"] == "random" and MD.read_marker(d)["allowed_token_ids"]
    monkeypatch.setenv(W.WEIGHTS_VAR, "auto")
    monkeypatch.setenv(W.HUB_IDS_VAR, "llama-tiny=gpulab-test/absent")
    assert MD.build_model_dir("llama-tiny", "fp32", root=tmp_path, device="cpu") == d
    assert "offline (HF_HUB_OFFLINE=1)" in capsys.readouterr().out
    with pytest.raises(MD.ServeError, match="weights must be 'auto' or 'random'"):
        MD.build_model_dir("llama-tiny", weights="real", root=tmp_path)
    monkeypatch.setenv(W.WEIGHTS_VAR, "bogus")
    with pytest.raises(MD.ServeError, match="GPULAB_WEIGHTS='bogus'"):
        MD.build_model_dir("llama-tiny", "fp32", root=tmp_path, device="cpu")


def test_finetune_and_quantize_load_the_cached_checkpoint(hub):
    """Lab 01's LoRA measurement and lab 03's quantization comparison take the same weights:
    LoRA starts as the base model (B = 0), so the first step's loss is the checkpoint's own loss
    on the book's first blocks in its own tokenizer, and falls as the adapters fit that batch;
    the 16-bit reference of the comparison loads those weights and measures perplexity in that
    tokenizer too."""
    from utils.model import quantize
    from utils.train import training

    _, _, state = hub
    r = training.measure_finetune("llama-tiny", training.RECIPES["lora_bf16_lean"], 2, 32, steps=2, device="cpu")
    assert r["weights"] == f"llama-tiny: real weights {REPO} from the local hub cache"
    lm = M.load_causal_lm("llama-tiny", dtype="bf16")
    x, _ = next(M.token_batches(lm.tokenizer, None, 2, 32, vocab_size=lm.model.config.vocab_size))
    assert int(x.max()) < hub_cache.TOKENIZER_VOCAB  # the checkpoint's tokenizer, not the shipped one
    with torch.no_grad():
        base = float(lm.model(input_ids=x, labels=x).loss)
    assert len(r["losses"]) == 3 and r["losses"][0] == pytest.approx(base, rel=2e-2)
    assert r["losses"][0] > r["losses"][1] > r["losses"][2]  # the same batch every step: the adapters fit it
    model = quantize.load("llama-tiny", "fp32", "cpu")
    assert model.gpulab_weights.real and _same_weights(model, state)
    ids = quantize.held_out_ids(tokenizer=M.model_tokenizer(model))
    q = quantize.compare("llama-tiny", prompt_len=8, new_tokens=2, ppl_seq_len=32, ppl_blocks=2, device="cpu",
                         max_runs=3, budget_s=0.3)
    assert q["weights"] == r["weights"]
    assert q["modes"]["fp32"]["perplexity"] == pytest.approx(quantize.perplexity(model, ids[8:], 32, 2), rel=1e-4)


@pytest.mark.slow
def test_an_engine_serves_the_cached_checkpoint(hub, tmp_path):
    """``transformers serve`` on the directory linked from the cache: its greedy text is the
    cached weights' own greedy continuation, and every request streams exactly the tokens it
    asks for (no end-of-sequence token). One engine start: about 2 minutes on two busy cores."""
    import urllib.request

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from utils.serving import loadgen, serve

    d = MD.build_model_dir("llama-tiny", "fp32", root=tmp_path, device="cpu")
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    prompt = "the master of the school said"
    ids = torch.tensor([M.encode(tok, prompt)])
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1]:]
    with serve.start(d, engine="transformers", device="cpu", kv_cache_tokens=1024, timeout_s=240) as server:
        body = json.dumps({"model": server.model, "prompt": prompt, "max_tokens": 6, "temperature": 0}).encode()
        req = urllib.request.Request(server.base_url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.loads(r.read())
        r = loadgen.run(loadgen.Workload(**server.workload_fields(), num_requests=3, input_len=16, output_len=10,
                                         concurrency=3), progress=False)
    assert answer["choices"][0]["text"] == tok.decode(want)
    assert r["completed"] == 3 and r["failed"] == 0, r["failures"]
    assert all(q["output_tokens"] == 10 for q in r["requests"])
