"""The row-wise batch-invariant kernels (kernels/invariant_rows.py: RMSNorm, the
vocabulary's log-softmax and the engine's sampling from it, each head's norm + rotary, and
silu * up, of --true-on-policy-mode on a GPU) under Triton's interpreter (this
file run as a script): against float64 references with stated tolerances, and a row's
result the same bits alone, among other rows and at another place in the launch. The
device runs them compiled, engine against trainer (test_true_on_policy_gpu.py)."""

from __future__ import annotations

import sys

import torch

from tests.interpreted import needs_triton, run_interpreted


@needs_triton
def test_invariant_row_kernels_under_the_interpreter():
    run_interpreted([__file__], "invariant rows ok", timeout=600)


def _rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.double()
    return w.double() * h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def check_rms_norm() -> None:
    from quantroll.kernels.invariant_rows import rms_norm

    # float32: the interpreter truncates float32 -> bfloat16 casts (the GPU rounds to nearest),
    # so BF16 rows are checked on the device (test_true_on_policy_gpu.py)
    for h in (128, 200):  # a power of two (the heads' norms) and a padded row
        w = 1 + 0.1 * torch.randn(h)
        x = 3 * torch.randn(37, h)
        got = rms_norm(x, w, 1e-6)
        ref = _rms_reference(x, w, 1e-6)
        # float32 sums of <= 256 squares against float64: a relative error of a few 1e-7
        assert torch.allclose(got.double(), ref.double(), rtol=2e-6, atol=0), (got.double() - ref).abs().max()
        for rows, place in ((x[5:6], 0), (x[3:9], 2), (torch.cat([x, x[5:6]]), 37)):
            assert torch.equal(rms_norm(rows, w, 1e-6)[place], got[5]), (h, rows.shape)
        heads = rms_norm(x.view(37, 1, h).expand(37, 3, h), w, 1e-6)  # [tokens, heads, D], a strided view
        assert torch.equal(heads[:, 1], got)


def check_log_softmax() -> None:
    from quantroll.kernels.invariant_rows import LOG_SOFTMAX_BLOCK, log_softmax

    v = 2 * LOG_SOFTMAX_BLOCK + 123  # three vocabulary steps, the last one partial
    x = 4 * torch.randn(9, v)
    x[2, 7] = 60.0  # one dominant entry
    got = log_softmax(x)
    ref = torch.log_softmax(x.double(), -1)
    assert torch.allclose(got.double(), ref, atol=2e-5, rtol=0), (got.double() - ref).abs().max()
    for rows, place in ((x[4:5], 0), (x[2:7], 2), (torch.cat([x[4:5].flip(-1), x[4:5]]), 1)):
        assert torch.equal(log_softmax(rows)[place], got[4]), rows.shape
    assert torch.equal(log_softmax(x.view(3, 3, v))[1, 1], got[4])  # leading dims flatten
    small = log_softmax(torch.tensor([[0.0, float("-inf"), 0.0]]))
    assert small[0, 1] == float("-inf") and torch.allclose(small[0, 0], torch.tensor(-0.6931472))


def check_sample() -> None:
    """The engine's untruncated sampling in the log-softmax pass: its logprob the bits the
    trainer's log_softmax has at that token; the token the Gumbel-max of the reference
    noise; greedy ties to the lowest id across vocabulary steps; a row alone as in a batch."""
    from quantroll.engine.sampling import gumbel_noise
    from quantroll.kernels.invariant_rows import LOG_SOFTMAX_BLOCK, log_softmax, sample

    v = LOG_SOFTMAX_BLOCK + 700
    x = 3 * torch.randn(6, v)
    seeds = torch.tensor([1, 2, 3, 4, 5, 2**40 + 7])
    positions = torch.tensor([9, 9, 100, 4, 0, 12])
    lp = log_softmax(x)
    tokens, token_lp = sample(x, False, seeds, positions)
    want = torch.argmax(lp + gumbel_noise(seeds, positions, v), -1)
    assert torch.equal(tokens, want), (tokens, want)
    assert torch.equal(token_lp, lp.gather(-1, tokens[:, None])[:, 0])
    alone = sample(x[4:5], False, seeds[4:5], positions[4:5])
    assert alone[0][0] == tokens[4] and torch.equal(alone[1][0], token_lp[4])
    tied = x.clone()
    tied[:, 3] = tied[:, LOG_SOFTMAX_BLOCK + 5] = 50.0  # the same maximum in two vocabulary steps
    greedy, greedy_lp = sample(tied, True, seeds, positions)
    assert (greedy == 3).all() and torch.equal(greedy_lp, log_softmax(tied)[:, 3])


def check_norm_rope() -> None:
    """Each head's RMSNorm then rotary against float64, a head's bits the same whatever
    tokens share the launch, on a strided view (a split of a fused projection)."""
    from quantroll.kernels.invariant_rows import norm_rope

    b, t, h, d = 2, 5, 3, 64
    fused = 2 * torch.randn(b, t, (h + 1) * d)
    x = fused[..., : h * d].view(b, t, h, d)  # a view with the fused row stride
    w = 1 + 0.1 * torch.randn(d)
    ang = torch.arange(t)[None, :, None].float() * torch.rand(1, 1, d // 2) + torch.arange(b)[:, None, None]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()
    got = norm_rope(x, w, 1e-6, cos, sin)
    x64 = x.double()
    n = w.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    rotated = torch.cat([-n[..., d // 2:], n[..., : d // 2]], -1)
    ref = n * cos.double()[:, :, None] + rotated * sin.double()[:, :, None]
    assert torch.allclose(got.double(), ref, atol=1e-5, rtol=1e-5), (got.double() - ref).abs().max()
    alone = norm_rope(x[1:2, 3:4], w, 1e-6, cos[1:2, 3:4], sin[1:2, 3:4])
    assert torch.equal(alone[0, 0], got[1, 3])


def check_silu_mul() -> None:
    from quantroll.kernels.invariant_rows import SILU_BLOCK, silu_mul

    i = SILU_BLOCK + 37  # two column blocks, the last partial
    gate_up = 3 * torch.randn(4, 2 * i)
    gate, up = gate_up.chunk(2, -1)  # strided rows, as a fused gate_up projection gives them
    got = silu_mul(gate, up)
    ref = torch.nn.functional.silu(gate.double()) * up.double()
    assert torch.allclose(got.double(), ref, atol=1e-5, rtol=1e-5), (got.double() - ref).abs().max()
    assert torch.equal(silu_mul(gate[2:3], up[2:3])[0], got[2])


if __name__ == "__main__":
    torch.manual_seed(0)
    check_rms_norm()
    check_log_softmax()
    check_sample()
    check_norm_rope()
    check_silu_mul()
    print("invariant rows ok")
    sys.exit(0)
