"""`quantroll bench rollout`'s table and the decode-GEMM label it records (the timings
themselves run on the GPU: docs/PERFORMANCE.md)."""

import torch

from quantroll.bench.rollout import RolloutResult, decode_gemm_label, format_table
from quantroll.bench.shapes import EIGHT_B_GEMMS, layer_gemm_shapes, shape_config


def _result(precision, step_ms, weight_bytes, gemm):
    return RolloutResult("qwen3-8b", 36, precision, 16, 128, 256, 1.0, 16 / step_ms * 1e3, step_ms, 2.0, step_ms / 2.0,
                         weight_bytes, 1e6, gemm)


def test_table_names_the_decode_gemm_and_the_speedup_against_the_byte_ratio():
    text = format_table(4.2e12, [_result("bfloat16", 5.0, 16e9, "cublas bf16"),
                                 _result("fp8 (real)", 3.5, 9e9, "cuda decode")])
    assert "cublas bf16" in text and "cuda decode" in text
    ideal = (16e9 + 1e6) / (9e9 + 1e6)
    assert f"fp8/bf16 decode speedup {5.0 / 3.5:.2f}x, byte ratio {ideal:.2f}x" in text


def test_decode_gemm_label_without_fp8_hardware():
    cfg = shape_config("qwen3-8b", 1)
    assert decode_gemm_label("bf16", 16, cfg, "cpu") == "cublas bf16"
    assert decode_gemm_label("fp8", 16, cfg, "cpu") == "emulated"
    assert decode_gemm_label("nvfp4", 16, cfg, "cpu") == "emulated"
    assert decode_gemm_label("fp8", 16, cfg, torch.device("cpu")) == "emulated"  # also where a GPU is present
    if not torch.cuda.is_available():
        assert decode_gemm_label("mxfp8", 1, cfg, "cpu") == "emulated"


def test_bad_arguments_are_refused_before_any_work(capsys, tmp_path):
    """Each in one line with exit status 2, before the GPU is even asked for (a bad --json
    path would otherwise surface after the whole benchmark)."""
    from quantroll.cli import main

    cases = [
        (["--batches", "0"], "--batches must all be >= 1"),
        (["--batches", "1,x"], "--batches takes comma-separated integers"),
        (["--precisions", "bf16,fp4"], "--precisions: unknown ['fp4']; choose from bf16, fp8, mxfp8, nvfp4"),
        (["--layers", "0"], "--layers must be in [1, 36] for qwen3-8b, got 0"),
        (["--shape", "qwen3-30b-a3b", "--layers", "49"], "--layers must be in [1, 48]"),
        (["--prompt-len", "0"], "--prompt-len must be >= 1"),
        (["--new-tokens", "-3"], "--new-tokens must be >= 1"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--json", str(tmp_path / "missing" / "out.json")], "is not a directory; create it first"),
    ]
    for extra, message in cases:
        assert main(["bench", "rollout", *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra


def test_layer_gemm_shapes_are_the_fused_weights_of_a_built_model():
    """The benches' per-layer GEMM shapes against the weights the engine fuses (a 1-layer
    model of a small odd config), and Qwen3-8B's published ones."""
    import dataclasses

    from quantroll.bench.shapes import random_model

    cfg = dataclasses.replace(shape_config("qwen3-8b", 1), hidden_size=192, intermediate_size=320,
                              num_attention_heads=6, num_key_value_heads=2, head_dim=48, vocab_size=64)
    layer = random_model(cfg, "cpu").model.layers[0]
    layer.mlp.fuse_()
    attn = layer.self_attn
    built = {"qkv": (attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features,
                     attn.q_proj.in_features),
             "o": tuple(attn.o_proj.weight.shape), "gate_up": tuple(layer.mlp.gate_up_proj.weight.shape),
             "down": tuple(layer.mlp.down_proj.weight.shape)}
    assert layer_gemm_shapes(cfg) == built
    assert EIGHT_B_GEMMS == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
