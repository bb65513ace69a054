"""utils.model.int8_checkpoint: the compressed-tensors W8A8 / W4A16 writer, offline on CPU, without vLLM."""
import json

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from utils.model import int8_checkpoint as ic  # noqa: E402
from utils.serving import serve  # noqa: E402


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return serve.build_model_dir("llama-tiny", "bf16", root=tmp_path_factory.mktemp("served"), device="cpu")


@pytest.fixture(scope="module")
def w8a8(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("ct") / "llama-tiny-w8a8"
    return out, ic.write_w8a8(src, out)


def _tensors(d):
    return safetensors_torch.load_file(str(d / "model.safetensors"))


def test_w8a8_config(src, w8a8):
    out, info = w8a8
    cfg = json.loads((out / "config.json").read_text())
    q = cfg["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "int-quantized"
    assert q["ignore"] == ["lm_head"]
    group = q["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    w, a = group["weights"], group["input_activations"]
    assert (w["num_bits"], w["type"], w["strategy"], w["symmetric"], w["dynamic"]) == (8, "int", "channel", True, False)
    assert (a["num_bits"], a["type"], a["strategy"], a["symmetric"], a["dynamic"]) == (8, "int", "token", True, True)
    src_cfg = json.loads((src / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src_cfg
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    marker = json.loads((out / serve.MARKER).read_text())
    assert marker["allowed_token_ids"] == serve.read_marker(src)["allowed_token_ids"]
    assert marker["weight_bytes"] == info["weight_bytes_after"]


def test_w8a8_weights(src, w8a8):
    out, info = w8a8
    before, after = _tensors(src), _tensors(out)
    linear = [n for n, t in before.items() if ".layers." in n and t.ndim == 2]
    assert info["layers_quantized"] == len(linear) == 2 * 7  # q k v o gate up down, 2 layers
    assert info["weight_bytes_before"] == sum(t.numel() * t.element_size() for t in before.values())
    assert info["weight_bytes_after"] == sum(t.numel() * t.element_size() for t in after.values())
    assert info["weight_bytes_after"] < info["weight_bytes_before"]
    for n in linear:
        q, s = after[n], after[n.replace(".weight", ".weight_scale")]
        assert q.dtype == torch.int8 and q.shape == before[n].shape
        assert s.dtype == torch.float32 and s.shape == (before[n].shape[0], 1)
        err = (q.double() * s.double() - before[n].double()).abs()
        assert (err <= s.double() / 2 * (1 + 1e-5)).all(), n  # half a step (fp32 rounding of w / s aside)
        assert q.abs().max() == 127  # every row's absmax lands on the last level
    untouched = [n for n in before if n not in linear]
    assert any("embed_tokens" in n for n in untouched) and "lm_head.weight" in untouched
    assert any("norm" in n for n in untouched)
    for n in untouched:
        assert after[n].dtype == before[n].dtype and torch.equal(after[n], before[n]), n
    assert set(after) == set(before) | {n.replace(".weight", ".weight_scale") for n in linear}


def test_w4a16_pack_roundtrip(src, tmp_path):
    info = ic.write_w4a16(src, tmp_path / "w4")
    assert info["group_size"] == 32  # llama-tiny's MLP is 352 wide: 128 and 64 do not divide it
    cfg = json.loads((tmp_path / "w4" / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "pack-quantized" and cfg["config_groups"]["group_0"]["weights"]["group_size"] == 32
    before, after = _tensors(src), _tensors(tmp_path / "w4")
    n = "model.layers.0.mlp.down_proj.weight"
    base = n[: -len(".weight")]
    w, packed, s = before[n], after[f"{base}.weight_packed"], after[f"{base}.weight_scale"]
    assert packed.dtype == torch.int32 and packed.shape == (w.shape[0], w.shape[1] // 8)
    assert after[f"{base}.weight_shape"].tolist() == list(w.shape) and n not in after
    q = ic.unpack_int4(packed, w.shape[1])
    assert q.min() >= -8 and q.max() <= 7
    assert torch.equal(ic.pack_int4(q), packed)
    deq = (q.float().reshape(w.shape[0], -1, 32) * s.float().unsqueeze(-1)).reshape(w.shape)
    step = s.float().repeat_interleave(32, dim=1)
    assert ((deq - w.float()).abs() <= step * 0.51).all()  # half a step, plus the bf16 scale's rounding


def test_config_validates_with_the_engines_compressed_tensors(w8a8):
    """The config as compressed-tensors itself parses it, in the environment vLLM loads it from
    (vLLM depends on compressed-tensors; the course's own environment does not need it)."""
    import subprocess

    from tests.conftest import need_vllm

    python = need_vllm().python
    code = ("import json, sys; from compressed_tensors.quantization import QuantizationConfig; "
            "c = QuantizationConfig.model_validate(json.load(open(sys.argv[1]))['quantization_config']); "
            "print(c.config_groups['group_0'].input_activations.dynamic, c.format)")
    r = subprocess.run([python, "-c", code, str(w8a8[0] / "config.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "int-quantized"]


def test_errors_are_one_line(tmp_path, src, w8a8):
    with pytest.raises(ic.CheckpointError) as e:
        ic.write_w8a8(tmp_path / "nowhere", tmp_path / "out")
    assert "no model directory at" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ic.CheckpointError, match="no config.json"):
        ic.write_w8a8(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(ic.CheckpointError, match="must differ"):
        ic.write_w8a8(src, src)
    with pytest.raises(ic.CheckpointError, match="unknown format"):
        ic.quantization_config("w2a2")
    with pytest.raises(ic.CheckpointError, match="already quantized"):
        ic.write_w8a8(w8a8[0], tmp_path / "again")
