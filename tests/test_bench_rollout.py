"""`quantroll bench rollout`'s table and the decode-GEMM label it records (the timings
themselves run on the GPU: docs/PERFORMANCE.md)."""

import torch

from quantroll.bench.rollout import RolloutResult, decode_gemm_label, format_table
from quantroll.bench.shapes import EIGHT_B_GEMMS, layer_gemm_shapes, shape_config


def _result(precision, step_ms, roof_ms, weight_bytes, gemm):
    return RolloutResult("qwen3-8b", 36, precision, 16, 128, 256, 1.0, 16 / step_ms * 1e3, step_ms, roof_ms,
                         step_ms / roof_ms, weight_bytes, 1e6, gemm)


def test_table_names_the_decode_gemm_and_the_speedup_against_the_roofline_ratio():
    from quantroll.bench.roofline import Peaks

    text = format_table(Peaks(4.2e12, 7.9e14, 1.5e15), [_result("bfloat16", 5.0, 4.0, 16e9, "cublas bf16"),
                                                        _result("fp8 (real)", 3.5, 2.5, 9e9, "cuda decode")])
    assert "cublas bf16" in text and "cuda decode" in text and "GEMM peak bf16 790 / fp8 1500 TFLOP/s" in text
    bytes_only = (16e9 + 1e6) / (9e9 + 1e6)
    assert (f"fp8/bf16 decode speedup {5.0 / 3.5:.2f}x, ideal (roofline ratio) {4.0 / 2.5:.2f}x "
            f"({100 * (5.0 / 3.5) / 1.6:.0f}% of ideal; bytes alone {bytes_only:.2f}x)") in text


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
        (["--layers", "30"], "--layers must be in [1, 28] for qwen3-1.7b, got 30"),  # the default study's second shape
        (["--shape", "qwen3-9b"], "--shape: unknown ['qwen3-9b']"),
        (["--workload", "rl", "--shape", "qwen3-8b,qwen3-1.7b"], "--workload rl takes one --shape"),
        (["--shape", "qwen3-30b-a3b", "--layers", "49"], "--layers must be in [1, 48]"),
        (["--prompt-len", "0"], "--prompt-len must be >= 1"),
        (["--new-tokens", "-3"], "--new-tokens must be >= 1"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--json", str(tmp_path / "missing" / "out.json")], "does not exist; create it first"),
        (["--workload", "rl", "--mean-len", "9000"], "--mean-len 9000 is above the cap --new-tokens 8192"),
        (["--workload", "rl", "--samples", "0"], "--samples must be >= 1"),
        (["--workload", "rl", "--kv-cache-dtypes", "bf16,int4"], "unknown KV cache dtype 'int4'"),
        (["--workload", "rl", "--policies", "continuous,paged"], "--policies continuous,paged: each must be"),
        (["--fp8-kv-attention", "triton"], "--fp8-kv-attention triton changes only the RL workload's FP8 KV cache runs"),
        (["--workload", "rl", "--kv-cache-dtypes", "bf16", "--fp8-kv-attention", "triton"],
         "--fp8-kv-attention triton changes only the RL workload's FP8 KV cache runs"),
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


def test_rl_workload_lengths_are_fixed_long_tailed_and_hit_their_mean():
    import statistics

    from quantroll.bench.workload import Workload, draw_lengths, workload_prompts

    w = Workload()
    lengths = draw_lengths(w)
    assert lengths == draw_lengths(Workload())  # the same draws for every system compared
    assert len(lengths) == 512 and min(lengths) >= 1 and max(lengths) == 8192
    assert abs(statistics.mean(lengths) - 2048) <= 0.05 * 2048
    assert statistics.median(lengths) < 0.75 * statistics.mean(lengths)  # long tail
    prompts = workload_prompts(Workload(prompts=3, samples=2, prompt_len=5), vocab=100)
    assert len(prompts) == 6 and prompts[0] == prompts[1] != prompts[2] == prompts[3]


def test_rl_roofline_sums_each_kernel_at_its_own_bound():
    """A hand-worked step: every term of roofline_ms for a tiny dense model, one chunk of
    two steps of two sequences."""
    import dataclasses

    from quantroll.bench.roofline import Peaks, weight_bytes_per_step
    from quantroll.bench.shapes import random_model, shape_config
    from quantroll.bench.workload import roofline_ms

    cfg = dataclasses.replace(shape_config("qwen3-8b", 1), hidden_size=256, intermediate_size=512,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1000)
    model = random_model(cfg, "cpu")
    peaks = Peaks(bandwidth=1e12, bf16_flops=1e15, fp8_flops=2e15)
    kv_token = 1000.0
    got = roofline_ms(model, [(2, 2, 2, 30)], kv_token, "bf16", peaks)
    lm = 1000 * 256 * 2
    weights = weight_bytes_per_step(model, 2) - lm
    params = 256 * (4 + 4) * 64 + 4 * 64 * 256 + 3 * 256 * 512
    want = 0.0
    for ctx in (30, 32):
        want += max(weights / 1e12, 2 * 2 * params / 1e15)
        want += max(lm / 1e12, 2 * 2 * 1000 * 256 / 1e15)
        want += max(ctx * kv_token / 1e12, 4 * ctx * 4 * 64 / 1e15)
    assert abs(got - want * 1e3) <= 1e-9 * want * 1e3


def test_fixed_roofline_averages_the_steps_of_the_fixed_workload():
    """Step s of P-token prompts and N new tokens reads P + s keys per row (s = 1 .. N-1): the
    mean of step_roofline_s over those steps, worked by hand for a tiny model (an FP8 step:
    its linears at the FP8 peak, the lm_head at BF16's)."""
    import dataclasses

    from quantroll.bench.roofline import Peaks, step_roofline_s, weight_bytes_per_step
    from quantroll.bench.rollout import mean_step_roofline_ms
    from quantroll.bench.shapes import random_model

    cfg = dataclasses.replace(shape_config("qwen3-8b", 1), hidden_size=256, intermediate_size=512,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1000)
    model = random_model(cfg, "cpu")
    peaks = Peaks(bandwidth=1e12, bf16_flops=1e15, fp8_flops=2e15)
    got = mean_step_roofline_ms(model, batch=3, prompt_len=10, new_tokens=4, kv_per_token=500.0, precision="fp8",
                                peaks=peaks)
    lm = 1000 * 256 * 2
    weights = weight_bytes_per_step(model, 3) - lm
    params = 256 * (4 + 4) * 64 + 4 * 64 * 256 + 3 * 256 * 512
    want = []
    for s in (1, 2, 3):
        ctx = 3 * (10 + s)
        want.append(max(weights / 1e12, 2 * 3 * params / 2e15) + max(lm / 1e12, 2 * 3 * 1000 * 256 / 1e15)
                    + max(ctx * 500.0 / 1e12, 4 * ctx * 4 * 64 / 1e15))
        assert abs(step_roofline_s(model, 3, ctx, 500.0, "fp8", peaks) - want[-1]) <= 1e-12 * want[-1]
    assert abs(got - sum(want) / 3 * 1e3) <= 1e-9 * got


def test_fp8_kv_attention_swaps_only_the_fp8_cache_decode_kernel():
    """--fp8-kv-attention cuda: the engine's own default (None), whose FP8 cache decodes on the
    CUDA kernel; triton: the default kernels with the FP8 cache's decode on the Triton tiles
    (BF16 caches, prefill and every other choice unchanged)."""
    import dataclasses

    from quantroll.commands.bench import workload_kernels
    from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS

    assert workload_kernels("cuda") is None and DEFAULT_ENGINE_KERNELS.attention_fp8.decode_kernel == "cuda"
    gpu = workload_kernels("triton").gpu
    assert gpu.attention_fp8 == DEFAULT_ENGINE_KERNELS.attention_fp8_triton
    assert gpu.attention_fp8.decode_kernel == "triton" and gpu.attention_bf16 == DEFAULT_ENGINE_KERNELS.attention_bf16
    assert dataclasses.replace(gpu, attention_fp8=DEFAULT_ENGINE_KERNELS.attention_fp8) == DEFAULT_ENGINE_KERNELS
