"""transformers (5.x) loads quantroll's FP8 and MXFP8 output on CPU with the same weights.

How transformers reads these checkpoints (5.24, checked here rather than assumed):
``FineGrainedFP8Config(dequantize=True)`` leaves every nn.Linear as it is and
dequantizes each (weight, weight_scale_inv) pair while loading, per expert before the
per-expert tensors are merged into the fused ``experts.gate_up_proj`` /
``experts.down_proj`` parameters. It computes ``q.float() * scale.float()`` in float32,
exactly the product quantroll's reference dequantize computes, then casts to the
model's dtype. So the loaded weights are bit-identical to quantroll's dequantized
weights in float32, and to them cast to BF16 when loading with dtype=bfloat16: the
tolerance is zero in both cases. uint8 (E8M0) scales are read as 2**(byte - 127).

It derives the block size from the weight and scale shapes (rows // scale_rows), which
is why weights with partial blocks load silently wrong (last test): the reason convert
keeps them in BF16 unless --allow-partial-blocks.
"""

import pytest
import torch

from quantroll.checkpoint import ConvertConfig, convert_checkpoint, load_quantized_checkpoint

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def load_dequantized(path, dtype):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(path),
        quantization_config=transformers.FineGrainedFP8Config(dequantize=True),
        dtype=dtype,
        output_loading_info=True,
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.state_dict()


def expected_param(ck, name, value):
    """The quantroll tensor that transformers' parameter ``name`` should hold (float32)."""
    if ".experts." in name and name.endswith(("gate_up_proj", "down_proj")):  # fused [E, out, in]
        prefix, proj = name.rsplit(".", 1)
        n_experts = value.shape[0]
        parts = ("gate_proj", "up_proj") if proj == "gate_up_proj" else ("down_proj",)
        return torch.stack([torch.cat([_weight(ck, f"{prefix}.{e}.{p}") for p in parts]) for e in range(n_experts)])
    return _weight(ck, name.removesuffix(".weight"))


def _weight(ck, module):
    if ck.is_quantized(module):
        return ck.dequantized(module, torch.float32)
    return ck.tensor(module + ".weight").to(torch.float32)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8"])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_transformers_loads_dequantized_weights_exactly(tmp_path, tiny_checkpoint, moe, fmt):
    src = tiny_checkpoint(moe=moe)
    dst = tmp_path / "q"
    convert_checkpoint(src, dst, ConvertConfig(fmt, progress=False))
    with load_quantized_checkpoint(dst) as ck:
        assert ck.quantized
        sd32 = load_dequantized(dst, torch.float32)
        sd16 = load_dequantized(dst, torch.bfloat16)
        if moe:
            assert "model.layers.0.mlp.experts.gate_up_proj" in sd32  # fused on load, per-expert in the file
        for name, value in sd32.items():
            want = expected_param(ck, name, value)
            assert torch.equal(value, want), name  # float32: bit-identical
            assert sd16[name].dtype == torch.bfloat16 and torch.equal(sd16[name], want.to(torch.bfloat16)), name


def test_transformers_misreads_partial_blocks(tmp_path, tiny_checkpoint):
    """Why partial blocks stay BF16 by default: transformers infers 100-row blocks from a 300x256 weight."""
    src = tiny_checkpoint(intermediate_size=300, head_dim=100)
    dst = tmp_path / "q"
    convert_checkpoint(src, dst, ConvertConfig("fp8", allow_partial_blocks=True, progress=False))
    sd = load_dequantized(dst, torch.float32)
    with load_quantized_checkpoint(dst) as ck:
        module = "model.layers.0.mlp.gate_proj"
        assert ck.is_quantized(module) and ck.quantized_tensor(module).scale.shape == (3, 2)
        assert not torch.equal(sd[module + ".weight"], ck.dequantized(module))
