"""Row offsets past 2^31 elements: a long prefill (e.g. Qwen3-8B, 64 prompts padded to
1366 tokens: 87,424 rows of gate_up, 2.1e9 elements) puts row x stride beyond int32 in
the per-row Triton kernels (silu * up, residual add + RMSNorm, activation quantization,
the MoE combine, the prefill GEMM). Each kernel runs on a tensor just past that size and
its last rows must equal what it gives on a small copy of those rows (offsets < 2^31).
GPU only (4-17 GB per test)."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")
if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
    pytest.skip("needs ~20 GB of GPU memory", allow_module_level=True)

from quantroll.kernels import fused, moe  # noqa: E402
from quantroll.kernels.fp8_linear import fp8_gemm_prefill, quantize_activation_fp8  # noqa: E402

LIMIT = 2**31
TAIL = 3  # rows compared at the end


def _rows_past(width: int) -> int:
    return LIMIT // width + 1


def _tail(x: torch.Tensor) -> torch.Tensor:
    return x[-TAIL:].clone()


def test_silu_mul_past_2_31_elements():
    inter = 8192
    gate_up = torch.randn(_rows_past(2 * inter), 2 * inter, device="cuda", dtype=torch.bfloat16)
    assert gate_up.numel() > LIMIT
    y = fused.silu_mul(gate_up)
    assert torch.equal(_tail(y), fused.silu_mul(_tail(gate_up)))
    del y
    act = fused.silu_mul(gate_up, quantize=True)
    small = fused.silu_mul(_tail(gate_up), quantize=True)
    assert torch.equal(_tail(act.codes).view(torch.uint8), small.codes.view(torch.uint8))
    assert torch.equal(_tail(act.scales), small.scales)


def test_add_rmsnorm_and_activation_quantization_past_2_31_elements():
    h = 4096
    x = torch.randn(_rows_past(h), h, device="cuda", dtype=torch.bfloat16)
    delta = torch.randn_like(x)
    weight = torch.rand(h, device="cuda", dtype=torch.bfloat16) + 0.5
    res, act = fused.add_rmsnorm(x, delta, weight, 1e-6, quantize=True, keep_bf16=True)
    small_res, small_act = fused.add_rmsnorm(_tail(x), _tail(delta), weight, 1e-6, quantize=True, keep_bf16=True)
    assert torch.equal(_tail(res), small_res)
    assert torch.equal(_tail(act.source), small_act.source)
    assert torch.equal(_tail(act.codes).view(torch.uint8), small_act.codes.view(torch.uint8))
    assert torch.equal(_tail(act.scales), small_act.scales)
    del res, act, delta
    q, s = quantize_activation_fp8(x)
    small_q, small_s = quantize_activation_fp8(_tail(x))
    assert torch.equal(_tail(q).view(torch.uint8), small_q.view(torch.uint8))
    assert torch.equal(_tail(s), small_s)


def test_moe_combine_past_2_31_elements():
    top_k, h = 8, 2048
    y = torch.randn(_rows_past(top_k * h), top_k, h, device="cuda", dtype=torch.bfloat16)
    weights = torch.rand(y.shape[0], top_k, device="cuda", dtype=torch.float32)
    out = moe.combine_experts(y, weights)
    assert torch.equal(_tail(out), moe.combine_experts(_tail(y), _tail(weights)))


def test_prefill_gemm_past_2_31_elements():
    from quantroll.formats import get_format

    k, n = 4096, 128
    rows = _rows_past(k)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    aq, a_s = quantize_activation_fp8(x)
    del x
    wq = get_format("fp8").quantize_weight(torch.randn(n, k, device="cuda") * 0.02)
    y = fp8_gemm_prefill(aq, a_s, wq.data, wq.scale)
    small_q, small_s = quantize_activation_fp8(torch.zeros(TAIL, k, device="cuda", dtype=torch.bfloat16))
    small_q.copy_(aq[-TAIL:])
    small_s.copy_(a_s[-TAIL:])
    # an output row depends on its own codes only (the same K order in every tile)
    assert torch.equal(_tail(y), fp8_gemm_prefill(small_q, small_s, wq.data, wq.scale))
