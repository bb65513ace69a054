"""utils.model.models: presets built offline, the shipped tokenizer and text, training batches."""
import json
import math

import pytest
import torch

from utils.measure import flops as F
from utils.model import models as M
from utils.model import weights as W

TINY = ["gpt2-tiny", "llama-tiny", "qwen-tiny"]
FULL = ["gpt2-small", "llama-1.1b", "qwen2.5-0.5b"]


@pytest.fixture
def no_hub_probe(monkeypatch):
    """Fail the test if anything tries to reach the hub."""
    def refuse(*a, **k):
        raise AssertionError("the hub was probed")
    monkeypatch.setattr(W, "hub_reachable", refuse)


@pytest.mark.parametrize("preset", TINY)
def test_tiny_preset_trains_one_step_on_cpu_quietly(preset, capfd, no_hub_probe):
    torch.manual_seed(0)
    lm = M.load_causal_lm(preset, offline=True)
    assert lm.weights == "random"
    model, vocab = lm.model, lm.model.config.vocab_size
    x, y = next(M.token_batches(lm.tokenizer, None, batch_size=2, seq_len=32, vocab_size=vocab))
    out = model(input_ids=x, labels=y)
    assert out.logits.shape == (2, 32, vocab)
    # random init predicts about uniformly: loss near ln(vocab)
    assert abs(out.loss.item() - math.log(vocab)) < 0.5
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
    # nbgrader scores a test cell 0 on any stderr output: building and the first loss must be silent
    assert capfd.readouterr().err == ""


def _published_total(preset: str) -> int:
    """Parameter totals computed by hand from the public configs (see utils/configs/README.md)."""
    if preset == "gpt2-small":
        d, v, L, p = 768, 50257, 12, 1024
        layer = (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 4 * d
        return v * d + p * d + L * layer + 2 * d  # LM head tied to wte
    if preset == "llama-1.1b":
        d, v, L, i, kv = 2048, 32000, 22, 5632, 256  # 4 KV heads x 64
        layer = d * d + 2 * d * kv + d * d + 3 * d * i + 2 * d
        return 2 * v * d + L * layer + d  # embed + untied head
    d, v, L, i, kv = 896, 151936, 24, 4864, 128  # Qwen2.5-0.5B: 2 KV heads x 64
    layer = (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * i + 2 * d
    return v * d + L * layer + d  # tied head


@pytest.mark.parametrize("preset, published, rel", [
    ("gpt2-small", 124.4e6, 0.001),  # "124M"; HF reports 124,439,808
    ("llama-1.1b", 1.1e9, 0.01),  # TinyLlama "1.1B"
    ("qwen2.5-0.5b", 0.494e9, 0.001),  # model card: 0.49B, 0.36B non-embedding
])
def test_full_presets_on_meta_match_published_sizes(preset, published, rel):
    model = M.build_model(preset, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    total = F.count_params(model, exclude_embeddings=False)
    assert total == _published_total(preset)
    assert total == pytest.approx(published, rel=rel)
    assert F.count_params(model) == F.non_embedding_params_from_config(M.preset_config_dict(preset))
    if preset == "qwen2.5-0.5b":  # the card's 0.36B non-embedding excludes the (tied) embedding
        assert total - 151936 * 896 == pytest.approx(0.36e9, rel=0.01)


def test_shipped_configs_cite_a_source_and_match_their_family():
    for name, preset in M.MODEL_PRESETS.items():
        raw = json.loads((M.CONFIG_DIR / preset.config_file).read_text())
        assert raw["_source"], name
        cfg = M.preset_config(name)
        assert "_source" not in cfg.to_dict()
    assert M.preset_config("llama-1.1b").num_key_value_heads == 4
    assert M.preset_config("qwen2.5-0.5b").tie_word_embeddings is True


def test_tiny_closed_form_counts_match_built_models():
    for preset in TINY:
        model = M.build_model(preset, device="meta")
        assert F.count_params(model) == F.non_embedding_params_from_config(M.preset_config(preset))


def test_build_model_dtype_and_overrides():
    model = M.build_model("llama-tiny", dtype="bf16", num_hidden_layers=1)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert len(model.model.layers) == 1
    with pytest.raises(ValueError, match="unknown dtype"):
        M.build_model("llama-tiny", dtype="int3")
    with pytest.raises(ValueError, match="unknown preset"):
        M.build_model("gpt5")


def test_tokenizer_round_trip_and_ids_below_every_vocab():
    tok = M.get_tokenizer(None)
    assert len(tok) == M.SHIPPED_VOCAB_SIZE
    assert tok.eos_token == M.EOS_TOKEN and tok.eos_token_id == 0
    text = M.load_text()[:20_000]
    ids = M.encode(tok, text)
    assert tok.decode(ids) == text
    odd = "naïve café, 日本語, emoji \U0001f600\ttabs  and  spaces\n"
    assert tok.decode(M.encode(tok, odd)) == odd  # byte-level: nothing is unknown
    assert max(ids) < M.SHIPPED_VOCAB_SIZE
    for preset in M.MODEL_PRESETS:
        assert M.SHIPPED_VOCAB_SIZE <= M.preset_config_dict(preset)["vocab_size"]
    assert M.TOKENIZER_FILE.stat().st_size < 1_000_000


def test_shipped_tokenizer_is_what_make_tokenizer_builds():
    shipped = json.loads(M.TOKENIZER_FILE.read_text())
    fresh = json.loads(M.train_tokenizer(M.load_text()).to_str())
    assert fresh["model"]["vocab"] == shipped["model"]["vocab"]
    assert fresh["model"]["merges"] == shipped["model"]["merges"]


def test_text_is_the_book_and_the_licence_ships():
    body = M.load_text()
    assert body.startswith("Produced by David Starner")
    assert "*** START OF" not in body and "*** END OF" not in body and "\r" not in body
    assert len(body) > 200_000
    full = M.load_text(full=True)
    assert "Project Gutenberg License" in full and "EBook #8868" in full


def test_token_batches_shapes_labels_and_wrap():
    tok = M.get_tokenizer(None)
    text = M.load_text()[:5000]
    ds = M.TokenBlocks(tok, text, seq_len=64)
    batches = list(M.token_batches(tok, text, batch_size=4, seq_len=64, steps=len(ds)))
    assert len(batches) == len(ds)
    x, y = batches[0]
    assert x.shape == y.shape == (4, 64) and x.dtype == torch.long
    assert torch.equal(x, y)  # HF convention: the model shifts
    assert torch.equal(x[0], ds[0][0]) and torch.equal(batches[1][0][0], ds[4][0])
    # after len(ds) batches of 4 the cursor has wrapped: every block was served 4 times
    served = torch.cat([b[0] for b in batches])
    assert served.shape[0] == 4 * len(ds)


def test_token_blocks_shifted_convention():
    tok = M.get_tokenizer(None)
    ds = M.TokenBlocks(tok, M.load_text()[:3000], seq_len=16, shifted=True)
    x, y = ds[0]
    assert x.shape == y.shape == (16,)
    assert torch.equal(x[1:], y[:-1])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_vocab_guard_and_bad_sizes():
    tok = M.get_tokenizer(None)
    with pytest.raises(ValueError, match=">= vocab_size 100"):
        next(M.token_batches(tok, "the quick brown fox " * 50, 2, 8, vocab_size=100))
    with pytest.raises(ValueError, match="fewer than one block"):
        M.TokenBlocks(tok, "short", seq_len=512)
    with pytest.raises(ValueError, match="batch_size"):
        next(M.token_batches(tok, None, 0, 8))


def test_offline_env_needs_no_network(monkeypatch, no_hub_probe):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert M.is_offline() is True
    lm = M.load_causal_lm("gpt2-small", device="meta")  # a full preset, offline: random weights
    assert lm.weights == "random"
    assert len(lm.tokenizer) == M.SHIPPED_VOCAB_SIZE
    assert len(M.get_tokenizer("llama-1.1b")) == M.SHIPPED_VOCAB_SIZE
    with pytest.raises(ValueError, match="no shipped config"):
        M.load_causal_lm("someone/some-model")


def test_is_offline_falls_back_to_the_probe(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(W, "hub_reachable", lambda: False)
    assert M.is_offline() is True
    monkeypatch.setattr(W, "hub_reachable", lambda: True)
    assert M.is_offline() is False
    assert M.is_offline(offline=True) is True


def test_hub_probe_parses_endpoint_without_network(monkeypatch):
    calls = []

    def fake_connect(address, timeout):
        calls.append((address, timeout))
        raise OSError("no network in tests")

    monkeypatch.setattr(W.socket, "create_connection", fake_connect)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.invalid:8080/path")
    W.hub_reachable.cache_clear()
    try:
        assert M.hub_reachable() is False
    finally:
        W.hub_reachable.cache_clear()
    assert calls == [(("mirror.invalid", 8080), 2.0)]


def test_online_path_takes_the_presets_hub_id(monkeypatch, tmp_path):
    """Online with an empty cache, a full preset asks for its own repository (the download is
    replaced: tests do not reach the network); a failed one is random weights."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", W.WEIGHTS_VAR, W.HUB_IDS_VAR):
        monkeypatch.delenv(var, raising=False)
    asked = []

    def no_download(hub_id):
        asked.append(hub_id)
        raise OSError("no network in tests")

    monkeypatch.setattr(W, "hub_reachable", lambda: True)
    monkeypatch.setattr(W, "_download", no_download)
    lm = M.load_causal_lm("gpt2-small", dtype="bf16", device="meta")
    assert asked == ["openai-community/gpt2"] and lm.weights == "random"
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    # smoke presets have no hub weights: random even online, and nothing is asked for
    assert M.load_causal_lm("qwen-tiny", offline=False).weights == "random" and asked == ["openai-community/gpt2"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("preset", FULL)
def test_full_preset_trains_one_step_on_gpu(preset):
    torch.cuda.reset_peak_memory_stats()
    model = M.build_model(preset, dtype="bf16", device="cuda")
    assert next(model.parameters()).device.type == "cuda"
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weight_bytes == 2 * F.count_params(model, exclude_embeddings=False)  # bf16, nothing on the host
    tok = M.get_tokenizer(None)
    x, y = next(M.token_batches(tok, None, 2, 256, device="cuda", vocab_size=model.config.vocab_size))
    loss = model(input_ids=x, labels=y).loss
    loss.backward()
    torch.cuda.synchronize()
    assert math.isfinite(loss.item())
    assert abs(loss.item() - math.log(model.config.vocab_size)) < 1.5  # random init: near uniform
    assert torch.cuda.max_memory_allocated() >= weight_bytes
