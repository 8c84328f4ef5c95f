"""AdamW on FP32 master weights for a BF16 model.

The model keeps BF16 parameters (what the forward computes with and what the weight
sync quantizes); the optimizer keeps an FP32 copy of each, applies the update there
and writes the rounded result back, so small updates accumulate instead of vanishing
under BF16 rounding. A model that computes in float32 on a CPU (quantroll/compute.py)
still gets BF16 values written back (``weight_dtype``), so its weights are the BF16
weights a GPU run would hold.
"""

from __future__ import annotations

import torch


class MasterWeightAdamW:
    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 weight_dtype: torch.dtype | None = torch.bfloat16):
        """weight_dtype: what the parameters' values are rounded to (None: their own dtype)."""
        self.params = [p for p in params if p.requires_grad]
        self.weight_dtype = weight_dtype
        self.master = [p.detach().to(torch.float32).clone().requires_grad_(True) for p in self.params]
        self.inner = torch.optim.AdamW(self.master, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self._sums: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self._sums = [None] * len(self.params)

    @torch.no_grad()
    def accumulate(self) -> None:
        """Move the gradients of one micro-batch into FP32 sums, so that accumulating
        several in a BF16 model loses nothing to BF16 additions."""
        for i, p in enumerate(self.params):
            if p.grad is not None:
                g = p.grad.to(torch.float32)
                self._sums[i] = g if self._sums[i] is None else self._sums[i].add_(g)
                p.grad = None

    def _gradients(self) -> list[torch.Tensor | None]:
        self.accumulate()
        return self._sums

    def grad_norm(self) -> float:
        total = sum(float(g.pow(2).sum()) for g in self._gradients() if g is not None)
        return total**0.5

    @torch.no_grad()
    def step(self, max_grad_norm: float | None = None) -> float:
        """Copy grads to FP32, clip, step, write back; returns the pre-clip grad norm."""
        norm = self.grad_norm()
        scale = 1.0 if not max_grad_norm or norm <= max_grad_norm else max_grad_norm / (norm + 1e-6)
        for g, m in zip(self._gradients(), self.master):
            m.grad = None if g is None else g * scale
        self._sums = [None] * len(self.params)
        self.inner.step()
        for p, m in zip(self.params, self.master):
            p.copy_(self._rounded(m, p))
        return norm

    def _rounded(self, master: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        return master.to(self.weight_dtype or param.dtype).to(param.dtype)

    def state_dict(self) -> dict:
        return {"master": [m.detach().clone() for m in self.master], "inner": self.inner.state_dict()}

    def export(self) -> tuple[list[torch.Tensor], dict]:
        """(FP32 master weights, AdamW's state_dict) as a save stores them: whole tensors.
        A sharded optimizer (quantroll/distributed/optimizer.py) gathers its shards here."""
        return list(self.master), self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._load_into(self.params, state)

    def _load_into(self, targets: list[torch.Tensor], state: dict) -> None:
        """The saved masters and moments in, and ``targets`` (the weights the masters update)
        set to their rounding."""
        with torch.no_grad():
            for m, saved, t in zip(self.master, state["master"], targets):
                m.copy_(saved)
                t.copy_(self._rounded(saved, t))
        self.inner.load_state_dict(state["inner"])
