"""MasterWeightAdamW (quantroll/trainer/optimizer.py) against AdamW written out in float64
from its paper's update (Loshchilov & Hutter: decoupled weight decay), and its save / load
round trip. The sharded subclass inherits this step; tests/dist compares it with one process."""

import math

import pytest
import torch

from quantroll.trainer.optimizer import MasterWeightAdamW

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False), torch.nn.Linear(3, 2))
    model.to(torch.bfloat16)
    model[2].weight.requires_grad_(False)  # frozen: no master, never written
    return model


def _grads(model: torch.nn.Module, step: int, micro: int) -> None:
    """Deterministic gradients of one micro-batch (the same for every optimizer under test)."""
    g = torch.Generator().manual_seed(100 * step + micro)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = (torch.randn(p.shape, generator=g) * (1 + step)).to(p.dtype)


def _reference(model: torch.nn.Module, steps: int, micros: int, max_norm: float | None):
    """AdamW in float64, one parameter at a time, with grads summed and clipped by hand."""
    params = [p for p in model.parameters() if p.requires_grad]
    w = [p.detach().double() for p in params]
    m = [torch.zeros_like(x) for x in w]
    v = [torch.zeros_like(x) for x in w]
    norms = []
    for t in range(1, steps + 1):
        sums = [torch.zeros_like(x) for x in w]
        for micro in range(micros):
            _grads(model, t, micro)
            for i, p in enumerate(params):
                sums[i] += p.grad.double()
        norm = math.sqrt(sum(float((s * s).sum()) for s in sums))
        norms.append(norm)
        scale = 1.0 if not max_norm or norm <= max_norm else max_norm / (norm + 1e-6)
        for i in range(len(w)):
            g = sums[i] * scale
            w[i] = w[i] * (1 - LR * WD)
            m[i] = BETAS[0] * m[i] + (1 - BETAS[0]) * g
            v[i] = BETAS[1] * v[i] + (1 - BETAS[1]) * g * g
            mhat, vhat = m[i] / (1 - BETAS[0] ** t), v[i] / (1 - BETAS[1] ** t)
            w[i] = w[i] - LR * mhat / (vhat.sqrt() + EPS)
    return w, norms


def _run(opt: MasterWeightAdamW, model: torch.nn.Module, first: int, last: int, micros: int, max_norm):
    norms = []
    for t in range(first, last + 1):
        opt.zero_grad()
        for micro in range(micros):
            _grads(model, t, micro)
            opt.accumulate()
        norms.append(opt.step(max_norm))
    return norms


@pytest.mark.parametrize("max_norm", [None, 5.0])
def test_step_matches_adamw_written_out_in_float64(max_norm):
    model = _model()
    frozen = model[2].weight.detach().clone()
    opt = MasterWeightAdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    norms = _run(opt, model, 1, 3, micros=2, max_norm=max_norm)
    ref, ref_norms = _reference(_model(), 3, 2, max_norm)
    assert len(opt.master) == len(ref) == 4
    for got, want in zip(norms, ref_norms):
        assert got == pytest.approx(want, rel=1e-6)
    if max_norm:
        assert max(ref_norms) > max_norm  # the clip was exercised
    for master, want in zip(opt.master, ref):
        assert master.dtype == torch.float32
        assert (master.double() - want).abs().max().item() <= 1e-5 * want.abs().max().item() + 1e-7
    # the parameters hold their master rounded to BF16; the frozen weight is untouched
    for p, master in zip([p for p in model.parameters() if p.requires_grad], opt.master):
        assert torch.equal(p, master.to(torch.bfloat16))
    assert torch.equal(model[2].weight, frozen)


def test_a_parameter_without_gradient_is_skipped_as_adamw_skips_it():
    model = _model()
    opt = MasterWeightAdamW(model.parameters(), lr=LR, weight_decay=WD)
    before = model[1].weight.detach().clone()
    _grads(model, 1, 0)
    model[1].weight.grad = None
    opt.step()
    assert torch.equal(model[1].weight, before)  # no step, not even the weight decay
    assert not torch.equal(model[0].weight, _model()[0].weight)


def test_save_and_load_continue_bit_for_bit():
    straight_model = _model()
    straight = MasterWeightAdamW(straight_model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    _run(straight, straight_model, 1, 4, micros=2, max_norm=5.0)

    first_model = _model()
    first = MasterWeightAdamW(first_model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    _run(first, first_model, 1, 2, micros=2, max_norm=5.0)
    saved = first.state_dict()

    resumed_model = _model(seed=7)  # other weights: the load must set them from the masters
    resumed = MasterWeightAdamW(resumed_model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    resumed.load_state_dict(saved)
    _run(resumed, resumed_model, 3, 4, micros=2, max_norm=5.0)
    for a, b in zip(resumed.master, straight.master):
        assert torch.equal(a, b)
    for (name, a), b in zip(resumed_model.named_parameters(), straight_model.parameters()):
        if a.requires_grad:
            assert torch.equal(a, b), name
