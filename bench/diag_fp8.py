"""Diagnose the FP8 linear paths on the device: relative error of each GEMM path against
a float64 emulation, per imprecise-accumulation setting, then the model-level gap."""
import dataclasses
import torch
from quantroll.formats import get_format
from quantroll.kernels.fp8_linear import (TritonGemmConfig, fp8_gemm_scaled_mm, fp8_gemm_triton,
                                          quantize_activation_fp8)
FP8 = get_format("fp8")
torch.manual_seed(0)
for m, n, k in [(1, 4096, 4096), (16, 4096, 4096), (256, 4096, 4096), (256, 12288, 4096)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wq = FP8.quantize_weight(torch.randn(n, k, device="cuda") * 0.02)
    aq, a_s = quantize_activation_fp8(x)
    ref = (FP8.dequantize(FP8.quantize_activation(x.float())).double() @ FP8.dequantize(wq).double().t())
    row = [f"M={m:4d} N={n:5d}"]
    for acc in (2**30, 128, 32, 0):
        try:
            y = fp8_gemm_triton(aq, a_s, wq.data, wq.scale, torch.float32, TritonGemmConfig(imprecise_acc=acc))
            row.append(f"triton acc={acc}: {((y.double() - ref).norm() / ref.norm()).item():.2e}")
        except Exception as e:
            row.append(f"triton acc={acc}: {type(e).__name__}")
    if m >= 16:
        y = fp8_gemm_scaled_mm(aq, a_s, wq.data, wq.scale, torch.float32)
        row.append(f"scaled_mm: {((y.double() - ref).norm() / ref.norm()).item():.2e}")
    print("  ".join(row), flush=True)

from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine
from quantroll.kernels import fp8_linear
cfg = dataclasses.replace(shape_config("qwen3-8b", 2), vocab_size=4096)
base = random_model(cfg, "cuda")
fp8 = random_model(cfg, "cuda", fmt=FP8, source=base)
ids = torch.randint(0, cfg.vocab_size, (4, 64), device="cuda")
with torch.no_grad():
    b = base(ids).float(); e = fp8(ids).float()
    Engine.from_model(fp8, FP8, "cuda")
    for min_m in (128, 10**9):
        fp8_linear.CONFIG = dataclasses.replace(fp8_linear.CONFIG, scaled_mm_min_m=min_m)
        r = fp8(ids).float()
        print(f"model: scaled_mm_min_m={min_m}: real-vs-emu {((r - e).norm() / e.norm()).item():.3e}  "
              f"fp8-vs-bf16 {((e - b).norm() / b.norm()).item():.3e}", flush=True)
    # per layer: hook outputs of each quantized linear, emulated vs real
    lin = fp8.model.layers[0].self_attn.q_proj
    h = torch.randn(256, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    lin.backend = "emulated"; y_e = lin(h).float()
    lin.backend = "fp8"; y_r = lin(h).float()
    print(f"q_proj M=256 real-vs-emu {((y_r - y_e).norm() / y_e.norm()).item():.3e}", flush=True)

# --- GEMM speed at decode sizes: bf16 cuBLAS vs FP8 Triton configs vs scaled_mm (GB/s of weight+act bytes)
import itertools
import triton

def bw(fn, nbytes):
    ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    return ms, nbytes / ms / 1e6

for m, n, k in [(16, 6144, 4096), (16, 4096, 4096), (16, 24576, 4096), (16, 4096, 12288), (64, 24576, 4096), (256, 24576, 4096)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    wq = FP8.quantize_weight(w)
    aq, a_s = quantize_activation_fp8(x)
    ms, g = bw(lambda: torch.nn.functional.linear(x, w), n * k * 2)
    best = (f"bf16 {ms*1e3:7.1f}us {g:6.0f}GB/s",)
    rows = []
    for bm, bn, sk, nw, ns in itertools.product([16] if m <= 16 else [16, 64], [32, 64, 128], [1, 2, 4, 8], [4], [3, 5]):
        c = TritonGemmConfig(block_m=bm, block_n=bn, split_k=sk, num_warps=nw, num_stages=ns)
        try:
            ms8, g8 = bw(lambda: fp8_gemm_triton(aq, a_s, wq.data, wq.scale, torch.bfloat16, c), n * k)
            rows.append((ms8, c))
        except Exception as e:
            pass
    rows.sort(key=lambda r: r[0])
    ms_q, _ = bw(lambda: quantize_activation_fp8(x), m * k * 3)
    out = f"M={m:3d} N={n:5d} K={k:5d}: {best[0]} | act-quant {ms_q*1e3:5.1f}us | "
    for ms8, c in rows[:3]:
        out += f"fp8 {ms8*1e3:7.1f}us {n*k/ms8/1e6:6.0f}GB/s bm{c.block_m} bn{c.block_n} sk{c.split_k} st{c.num_stages}; "
    if m >= 16:
        ms_s, _ = bw(lambda: fp8_gemm_scaled_mm(aq, a_s, wq.data, wq.scale, torch.bfloat16), n * k)
        out += f"scaled_mm {ms_s*1e3:7.1f}us {n*k/ms_s/1e6:6.0f}GB/s"
    print(out, flush=True)
