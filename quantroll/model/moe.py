"""Qwen3-MoE sparse block, with expert choices that can be recorded and replayed.

The router is a BF16 linear (``mlp.gate``); its softmax runs in float32 and the top-k
experts of each token are chosen from it, as transformers does. A ``Routing`` object
may take over the choice: the engine records what it chose, the trainer replays it
(R3). Replay forces only the indices: the weights are re-gathered from the trainer's
own router probabilities at those indices, so the router keeps its gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantroll.model import invariant
from quantroll.model.config import ModelConfig
from quantroll.model.kernel_config import DEFAULT_PLAN, ForwardPlan
from quantroll.model.layers import MLP, FormatFor, linear


class Routing:
    """Chooses (or records) top-k experts per token. Subclass to record (override
    ``chose``) or to replay (override ``select`` and set ``replays``)."""

    replays = False  # True: select() forces given choices; the router's own top-k is not used

    def select(self, layer_idx: int, probs: torch.Tensor, top_k: int) -> torch.Tensor:
        return self.chose(layer_idx, torch.topk(probs, top_k, dim=-1).indices)

    def chose(self, layer_idx: int, idx: torch.Tensor) -> torch.Tensor:
        """The router's own top-k for this layer, [N, top_k] (also from the GPU engine's
        fused router, which skips ``select``); returns it."""
        return idx


class RecordRouting(Routing):
    """Chooses top-k as usual and keeps each MoE layer's choice: {layer: [N, top_k]}."""

    def __init__(self):
        self.chosen: dict[int, torch.Tensor] = {}

    def chose(self, layer_idx, idx):
        self.chosen[layer_idx] = idx
        return idx


class ReplayRouting(Routing):
    """Forces given choices: {layer: [N, top_k]} in the flattened token order of the batch."""

    replays = True

    def __init__(self, chosen: dict[int, torch.Tensor]):
        self.chosen = chosen

    def select(self, layer_idx, probs, top_k):
        idx = self.chosen[layer_idx].to(device=probs.device, dtype=torch.long)
        if idx.shape != (probs.shape[0], top_k):
            raise ValueError(f"replayed routing for layer {layer_idx} has shape {tuple(idx.shape)}, "
                             f"expected {(probs.shape[0], top_k)}")
        return idx


class SparseMoE(torch.nn.Module):
    plan: ForwardPlan = DEFAULT_PLAN  # the model's, handed over by CausalLM.prepare_

    def __init__(self, cfg: ModelConfig, layer_idx: int, fmt_for: FormatFor, dtype, device=None):
        super().__init__()
        p = f"model.layers.{layer_idx}.mlp."
        self.layer_idx, self.top_k, self.norm_topk_prob = layer_idx, cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = linear(p + "gate", fmt_for, cfg.hidden_size, cfg.num_experts, False, dtype, device)
        self.stacks: dict[str, torch.Tensor] | None = None  # set by stack_experts_ (GPU engine)
        self.experts = torch.nn.ModuleList(
            MLP(f"{p}experts.{e}.", cfg.hidden_size, cfg.moe_intermediate_size, fmt_for, dtype, device,
                cfg.block.mlp_bias)
            for e in range(cfg.num_experts)
        )

    def takes_fp8_activation(self) -> bool:
        """Whether the norm before this block should hand it its input quantized too (an
        Fp8Activation whose ``source`` holds the BF16 values the router reads): the
        grouped block-FP8 experts then skip their own activation-quantization launch."""
        from quantroll.kernels import fused

        return (self.stacks is not None and "down_scale" in self.stacks and self.plan.kernels.gpu.fuse_activation_quant
                and self.gate.in_features % fused.FP8_GROUP == 0)

    def route(self, x: torch.Tensor, routing: Routing | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert indices [N, k], routing weights [N, k]) for flattened tokens x [N, H].

        With stacked experts (the GPU engine) and no replay, one kernel does softmax, top-k
        and the weights (``moe.fused_route``: ties go to the lower expert id)."""
        logits = self.gate(x)
        routing = routing or Routing()
        if self.stacks is not None and not routing.replays and logits.is_cuda:
            from quantroll.kernels.moe import fused_route

            idx, weights = fused_route(logits, self.top_k, self.norm_topk_prob)
            return routing.chose(self.layer_idx, idx), weights
        if self.plan.kernels.batch_invariant:
            return self._route_invariant(logits, routing)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        idx = routing.select(self.layer_idx, probs, self.top_k)
        weights = probs.gather(-1, idx)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return idx, weights.to(logits.dtype)

    def _route_invariant(self, logits: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
        """route() with a tree-sum softmax and an argmax top-k (ties to the lower expert id),
        so that engine and trainer choose the same experts from the same logits."""
        probs = invariant.softmax(logits)
        if routing.replays:
            idx = routing.select(self.layer_idx, probs, self.top_k)
        else:
            idx = routing.chose(self.layer_idx, invariant.top_k(probs, self.top_k))
        weights = probs.gather(-1, idx)
        if self.norm_topk_prob:
            weights = weights / invariant.tree_sum(weights, -1, keepdim=True)
        return idx, weights.to(logits.dtype)

    @torch.no_grad()
    def stack_experts_(self, combine_gate_up: bool = True) -> None:
        """Move every expert's weights into stacked [E, out, in] tensors (the experts'
        modules become views into them, so in-place weight loads still reach them) and
        route forward through the grouped GPU kernel. Inference only: no autograd. Called
        by CausalLM.prepare_ where the plan says ``stack_experts`` (and by kernel tests on a
        block alone).

        gate and up share one stack, each expert's gate rows then its up rows ("gate_up",
        [E, 2I, H]), so one grouped GEMM computes both and one kernel applies silu * up;
        for block FP8 only when I is a multiple of 128 (so no scale block straddles the
        two), else (or with ``combine_gate_up`` False) they stay apart ("gate", "up")."""
        layers = {proj: [getattr(expert, f"{proj}_proj") for expert in self.experts] for proj in ("gate", "up", "down")}
        first = layers["gate"][0]
        if first.quantized and first.format.emulated_only:
            return  # the grouped kernel serves BF16 and block FP8; other formats stay emulated
        fields = ["weight", "weight_scale"] if first.quantized else ["weight"]
        groups = [("down", ["down"])]
        if combine_gate_up and (not first.quantized or first.out_features % 128 == 0):
            groups.append(("gate_up", ["gate", "up"]))
        else:
            groups += [("gate", ["gate"]), ("up", ["up"])]
        stacks = {}
        for name, projs in groups:
            for field in fields:
                parts = [[getattr(layer, field).detach() for layer in layers[proj]] for proj in projs]
                stack = torch.stack([torch.cat(per_expert) for per_expert in zip(*parts)])
                row = 0
                for proj in projs:
                    rows = getattr(layers[proj][0], field).shape[0]
                    for e, layer in enumerate(layers[proj]):
                        view = stack[e, row:row + rows]
                        if isinstance(getattr(layer, field), torch.nn.Parameter):
                            view = torch.nn.Parameter(view, requires_grad=False)
                        setattr(layer, field, view)
                        layer.invalidate()
                    row += rows
                stacks[name if field == "weight" else f"{name}_scale"] = stack
        self.stacks = stacks

    def forward(self, x, routing: Routing | None = None) -> torch.Tensor:
        """x: BF16 [..., H], or (the fused GPU path, see takes_fp8_activation) an
        Fp8Activation carrying its BF16 source."""
        quantized = None
        if not isinstance(x, torch.Tensor):
            quantized, x = (x.codes, x.scales), x.source
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        idx, weights = self.route(flat, routing)
        if self.stacks is not None:
            from quantroll.kernels.moe import grouped_experts_forward

            return grouped_experts_forward(flat, idx, weights, self.stacks, quantized, self.plan.kernels.gpu).reshape(shape)
        out = torch.zeros_like(flat)
        for e in torch.unique(idx).tolist():
            token, slot = torch.where(idx == e)
            y = self.experts[e](flat[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out.reshape(shape)
