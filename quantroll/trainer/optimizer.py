"""AdamW on FP32 master weights for a BF16 model.

The model keeps BF16 parameters (what the forward computes with and what the weight
sync quantizes); the optimizer keeps an FP32 copy of each, applies the update there
and writes the rounded result back, so small updates accumulate instead of vanishing
under BF16 rounding. A model that computes in float32 on a CPU (quantroll/compute.py)
still gets BF16 values written back (``weight_dtype``), so its weights are the BF16
weights a GPU run would hold.
"""

from __future__ import annotations

import math

import torch


class MasterWeightAdamW:
    """The step logic, once: the sharded optimizer (quantroll/distributed/optimizer.py)
    overrides only what sharding changes: which tensor a parameter's gradient and update
    live in (``_local_grad``, the ``targets`` of ``_build``), the sum of squares over
    ranks (``_global_sum``), which parameters stepped (``_used``) and the save format."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 weight_dtype: torch.dtype | None = torch.bfloat16):
        """weight_dtype: what the parameters' values are rounded to (None: their own dtype)."""
        params = [p for p in params if p.requires_grad]
        self._build(params, params, lr, betas, eps, weight_decay, weight_dtype)

    def _build(self, params: list[torch.Tensor], targets: list[torch.Tensor], lr: float, betas, eps: float,
               weight_decay: float, weight_dtype: torch.dtype | None) -> None:
        """``params``: the trained parameters (their ``.grad`` is read); ``targets``: the
        tensors each step writes its rounded master into, and the masters start from (the
        parameters themselves, or this rank's shards of them)."""
        self.params = params
        self._targets = targets
        self.weight_dtype = weight_dtype
        # plain tensors, outside autograd: AdamW reads the .grad each step sets
        self.master = [t.detach().to(torch.float32).clone() for t in targets]
        self.inner = torch.optim.AdamW(self.master, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self._sums: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self._sums = [None] * len(self.params)

    def _local_grad(self, p: torch.Tensor) -> torch.Tensor:
        """``p``'s gradient as the FP32 tensor the sums start from (a new tensor or one
        nobody else holds: the sums add into it in place)."""
        return p.grad.to(torch.float32)

    @torch.no_grad()
    def accumulate(self) -> None:
        """Move the gradients of one micro-batch into FP32 sums, so that accumulating
        several in a BF16 model loses nothing to BF16 additions."""
        for i, p in enumerate(self.params):
            if p.grad is not None:
                g = self._local_grad(p)
                self._sums[i] = g if self._sums[i] is None else self._sums[i].add_(g)
                p.grad = None

    def _gradients(self) -> list[torch.Tensor | None]:
        self.accumulate()
        return self._sums

    def _global_sum(self, local: float) -> float:
        """The sum of ``local`` over every process holding a part of the parameters."""
        return local

    def grad_norm(self) -> float:
        local = sum(float(g.pow(2).sum()) for g in self._gradients() if g is not None)
        return math.sqrt(self._global_sum(local))

    def _used(self, grads: list[torch.Tensor | None]) -> list[bool]:
        """Which parameters step: one process steps those that got a gradient (AdamW skips
        the others: no moment decay, no step)."""
        return [g is not None for g in grads]

    @torch.no_grad()
    def step(self, max_grad_norm: float | None = None) -> float:
        """Copy grads to FP32, clip, step, write back; returns the pre-clip grad norm."""
        norm = self.grad_norm()
        scale = 1.0 if not max_grad_norm or norm <= max_grad_norm else max_grad_norm / (norm + 1e-6)
        grads = self._gradients()
        for g, m, used in zip(grads, self.master, self._used(grads)):
            m.grad = g * scale if used else None
        self._sums = [None] * len(self.params)
        self.inner.step()
        for t, m in zip(self._targets, self.master):
            t.copy_(self._rounded(m, t))
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
        self._load_into(self._targets, state)

    def _load_into(self, targets: list[torch.Tensor], state: dict) -> None:
        """The saved masters and moments in, and ``targets`` (the weights the masters update)
        set to their rounding."""
        with torch.no_grad():
            for m, saved, t in zip(self.master, state["master"], targets):
                m.copy_(saved)
                t.copy_(self._rounded(saved, t))
        self.inner.load_state_dict(state["inner"])
