"""save_hf_checkpoint: a trained policy as an HF BF16 checkpoint that everything loads."""

import json
import os
import stat

import pytest
import torch
from safetensors import safe_open

from quantroll.builtin import TinyQwen3, write_tiny_qwen3
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.engine import Engine
from quantroll.errors import QuantrollError
from quantroll.model.loader import load_model
from quantroll.trainer.export import save_hf_checkpoint
from quantroll.trainer.policy import load_policy

SMALL = TinyQwen3(intermediate_size=256, num_hidden_layers=2)


@pytest.fixture()
def src(tmp_path):
    return write_tiny_qwen3(tmp_path / "src", SMALL, seed=3)


def _perturb(model):
    """Change every weight so a round trip that silently reads the source would fail."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=g) * 0.01).to(p.dtype))


def _stored_names(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_round_trip_gives_identical_bf16_tensors(src, tmp_path):
    policy = load_policy(src)
    _perturb(policy)
    out = save_hf_checkpoint(policy, src, tmp_path / "out")
    back = load_policy(out)
    a, b = dict(policy.named_parameters()), dict(back.named_parameters())
    assert a.keys() == b.keys()
    for name in a:
        assert b[name].dtype == torch.bfloat16
        assert torch.equal(a[name].detach(), b[name].detach()), name


def test_float32_policy_is_written_as_its_bf16_rounding(src, tmp_path):
    policy = load_policy(src, dtype=torch.float32)
    _perturb(policy)
    out = save_hf_checkpoint(policy, src, tmp_path / "out")
    back = dict(load_policy(out).named_parameters())
    for name, p in policy.named_parameters():
        assert torch.equal(p.detach().to(torch.bfloat16), back[name].detach()), name
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_config_tokenizer_and_generation_config_come_from_the_source(src, tmp_path):
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8"}  # a stray one must not survive
    (src / "config.json").write_text(json.dumps(cfg))
    out = save_hf_checkpoint(load_model(write_tiny_qwen3(tmp_path / "plain", SMALL, seed=3))[0], src, tmp_path / "out")
    written = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in written
    assert {k: v for k, v in written.items() if k != "torch_dtype"} == {k: v for k, v in cfg.items()
                                                                     if k not in ("quantization_config", "torch_dtype")}
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".quantroll", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"])


def test_fused_engine_model_exports_only_checkpoint_tensors(src, tmp_path):
    engine = Engine(src)  # fuses q/k/v and gate/up into qkv_proj / gate_up_proj parameters
    assert any(n.endswith("qkv_proj.weight") for n, _ in engine.model.named_parameters())
    out = save_hf_checkpoint(engine.model, src, tmp_path / "out")
    assert _stored_names(out) == _stored_names(src)
    with safe_open(str(out / "model.safetensors"), "pt") as a, safe_open(str(src / "model.safetensors"), "pt") as b:
        for name in b.keys():
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name


def test_tied_lm_head_is_not_written(tmp_path):
    src = write_tiny_qwen3(tmp_path / "tied", TinyQwen3(intermediate_size=256, num_hidden_layers=1, tie_word_embeddings=True))
    policy = load_policy(src)
    _perturb(policy)
    out = save_hf_checkpoint(policy, src, tmp_path / "out")
    assert "lm_head.weight" not in _stored_names(out)
    back = load_policy(out)
    assert back.lm_head.weight is back.model.embed_tokens.weight
    assert torch.equal(back.lm_head.weight, policy.lm_head.weight)


def test_transformers_loads_the_export_with_no_missing_or_unexpected_keys(src, tmp_path):
    transformers = pytest.importorskip("transformers")
    policy = load_policy(src, dtype=torch.float32)
    _perturb(policy)
    out = save_hf_checkpoint(policy, src, tmp_path / "out")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = torch.tensor([[5, 9, 17, 40, 41]])
    ours = load_policy(out, dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, ours(ids), atol=1e-4)


def test_quantroll_convert_accepts_the_export(src, tmp_path):
    policy = load_policy(src)
    _perturb(policy)
    out = save_hf_checkpoint(policy, src, tmp_path / "out")
    fp8 = tmp_path / "fp8"
    convert_checkpoint(out, fp8, ConvertConfig(format="fp8", progress=False))
    engine = Engine(fp8)
    assert engine.precision.startswith("fp8")
    assert "model.layers.0.mlp.down_proj" in engine.quantized_layers()


def test_export_is_atomic_and_replaces_an_old_directory(src, tmp_path, monkeypatch):
    policy = load_policy(src)
    out = save_hf_checkpoint(policy, src, tmp_path / "out")
    before = (out / "model.safetensors").read_bytes()
    _perturb(policy)

    import quantroll.trainer.export as export

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "save_file", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        save_hf_checkpoint(policy, src, out, force=True)
    assert (out / "model.safetensors").read_bytes() == before  # the old one, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # no partial directory left
    monkeypatch.undo()
    save_hf_checkpoint(policy, src, out, force=True)
    assert (out / "model.safetensors").read_bytes() != before
    with pytest.raises(QuantrollError, match="--save-hf o already holds an output quantroll wrote; pass --force"):
        save_hf_checkpoint(policy, src, out, what="--save-hf o")


def test_export_never_replaces_the_users_files_and_follows_the_umask(src, tmp_path):
    policy = load_policy(src)
    old = os.umask(0o027)
    try:
        out = save_hf_checkpoint(policy, src, tmp_path / "out")
    finally:
        os.umask(old)
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o640  # not safetensors' 0600
    (out / "notes.txt").write_text("mine")
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(QuantrollError, match=r"did not write \(notes.txt\).*--force or not"):
        save_hf_checkpoint(policy, src, out, force=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").read_bytes() == before


def test_quantized_model_and_mismatched_source_are_refused(src, tmp_path):
    fp8 = tmp_path / "fp8"
    convert_checkpoint(src, fp8, ConvertConfig(format="fp8", progress=False))
    with pytest.raises(QuantrollError, match="quantized layers"):
        save_hf_checkpoint(load_model(fp8)[0], src, tmp_path / "a")
    other = write_tiny_qwen3(tmp_path / "other", TinyQwen3(intermediate_size=256, num_hidden_layers=3))
    with pytest.raises(QuantrollError, match="num_hidden_layers"):
        save_hf_checkpoint(load_policy(src), other, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
