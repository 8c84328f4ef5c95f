"""`convert` on Llama 3.x and Qwen2.5 checkpoints (every linear a whole number of 128 x 128
blocks, biases on): transformers reloads the FP8 / MXFP8 output with every weight equal to
quantroll's dequantized weight in float32 (tolerance zero) and every bias equal to the
source's BF16 bias; the biases are copied, never quantized, and quantroll's engine runs the
converted checkpoint with the same logits as the BF16 model over the dequantized weights."""

import dataclasses

import pytest
import torch

from quantroll.bench.shapes import shape_config
from quantroll.checkpoint import ConvertConfig, convert_checkpoint, load_quantized_checkpoint
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.model.kernel_config import ForwardPlan, TrainFormat
from quantroll.model.loader import load_model
from quantroll.model.random_checkpoint import write_random_checkpoint

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

# 4 q heads and 2 k/v heads of 64: q 256 x 256, k/v 128 x 256, o 256 x 256, MLP 384 x 256
CASES = {
    "llama-biases": ("llama3.1-8b", ("attention_bias", "mlp_bias")),
    "qwen2": ("qwen2.5-1.5b", ()),
}


def _write(tmp_path, case):
    shape, flags = CASES[case]
    cfg = dataclasses.replace(shape_config(shape, 2), vocab_size=128, hidden_size=256, intermediate_size=384,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, bias_flags=flags)
    src = write_random_checkpoint(cfg, tmp_path / case, seed=2)
    return src, cfg


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8"])
@pytest.mark.parametrize("case", list(CASES))
def test_transformers_reloads_weights_exactly_and_biases_in_bf16(tmp_path, case, fmt):
    src, cfg = _write(tmp_path, case)
    dst = tmp_path / fmt
    convert_checkpoint(src, dst, ConvertConfig(fmt, progress=False))
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(dst), quantization_config=transformers.FineGrainedFP8Config(dequantize=True), dtype=torch.float32,
        output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    state = hf.state_dict()
    with CheckpointReader(src) as source, load_quantized_checkpoint(dst) as ck:
        biases = [n for n in source.tensors if n.endswith(".bias")]
        assert len(biases) == (7 if case.startswith("llama") else 3) * cfg.num_hidden_layers
        for name in biases:
            stored = ck.tensor(name)
            assert stored.dtype == torch.bfloat16 and torch.equal(stored, source.load(name)), name
            assert torch.equal(state[name], stored.float()), name
        linears = [n.removesuffix(".weight") for n in source.tensors if n.endswith("_proj.weight")]
        assert linears and all(ck.is_quantized(m) for m in linears)  # every linear, biased or not (bias beside it)
        for module in linears:
            assert torch.equal(state[module + ".weight"], ck.dequantized(module, torch.float32)), module


@pytest.mark.parametrize("case", list(CASES))
def test_converted_checkpoint_runs_with_the_dequantized_weights(tmp_path, case):
    """The engine's emulated FP8 linears against BF16-free arithmetic: each linear of the converted
    model equals a float32 linear over the dequantized weight and the quantize-dequantized input,
    bias added; so the whole model's logits equal a float32 model built that way."""
    src, _ = _write(tmp_path, case)
    dst = tmp_path / "fp8"
    convert_checkpoint(src, dst, ConvertConfig("fp8", progress=False))
    fp8, fmt = load_model(dst, dtype=torch.float32)
    assert fmt is not None and fmt.name == "fp8"
    ref, _ = load_model(src, dtype=torch.float32)
    with torch.no_grad():
        for name, layer in fp8.quantized_linears().items():
            target = dict(ref.named_modules())[name]
            target.weight.copy_(layer.dequantized_weight())
            if layer.bias is not None:
                assert torch.equal(layer.bias, target.bias), name
    # activations quantized as the engine's emulation does, on the layers it holds quantized
    ref.prepare_(ForwardPlan(train=TrainFormat(fmt, frozenset(fp8.quantized_linears()))))
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = fp8(ids), ref(ids)
    assert (got - want).abs().max().item() <= 1e-5
