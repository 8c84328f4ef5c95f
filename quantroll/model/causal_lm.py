"""The decoder-only causal language model of every family (model/families/), in plain PyTorch.

What a family changes (QK-norm, biases, MoE layers, rope variant) arrives as data in the
``ModelConfig`` (``cfg.block``, ``cfg.is_moe_layer``, ``cfg.rope``); nothing here names a
family. Module and parameter names are the checkpoint's names, so a state dict loads by name.
Which linears are quantized, and in which format, is decided by ``fmt_for(name)``
(the loader derives it from the checkpoint); everything else stays in the model dtype.
"""

from __future__ import annotations

import torch

from quantroll.checkpoint.bf16_rule import unless_kept
from quantroll.model.config import ModelConfig
from quantroll.errors import QuantrollError
from quantroll.model.kernel_config import DEFAULT_PLAN, ForwardPlan, KernelConfig
from quantroll.model.layers import (MLP, Attend, Attention, FormatFor, RMSNorm, causal_attend, invariant_causal_attend,
                                    takes_fp8_activation)
from quantroll.model.linear import QLinear
from quantroll.model.moe import Routing, SparseMoE
from quantroll.model.rope import Rotary


def bf16_everywhere(_: str) -> None:
    return None


class DecoderLayer(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, i: int, fmt_for: FormatFor, dtype, device=None):
        super().__init__()
        self.self_attn = Attention(cfg, i, fmt_for, dtype, device)
        if cfg.is_moe_layer(i):
            self.mlp: torch.nn.Module = SparseMoE(cfg, i, fmt_for, dtype, device)
        else:
            self.mlp = MLP(f"model.layers.{i}.mlp.", cfg.hidden_size, cfg.intermediate_size, fmt_for, dtype, device,
                           cfg.block.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)

    def mlp_input(self) -> tuple[bool, bool]:
        """(quantize, keep_bf16) for the post-attention norm's output: quantized for a dense
        MLP's block-FP8 gate_up_proj; for a MoE block on grouped block-FP8 experts, both
        quantized (the experts) and in BF16 (the router)."""
        if isinstance(self.mlp, MLP):
            return takes_fp8_activation(self.mlp.gate_up_proj), False
        both = self.mlp.takes_fp8_activation()
        return both, both

    def forward(self, x, cos, sin, attend: Attend, routing: Routing | None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, routing) if isinstance(self.mlp, SparseMoE) else self.mlp(h))


class DecoderStack(torch.nn.Module):
    plan: ForwardPlan = DEFAULT_PLAN  # the model's, handed over by CausalLM.prepare_

    def __init__(self, cfg: ModelConfig, fmt_for: FormatFor, dtype, device=None):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        self.layers = torch.nn.ModuleList(DecoderLayer(cfg, i, fmt_for, dtype, device) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.rotary = Rotary(cfg, device)

    def forward(self, input_ids, positions, attend: Attend = causal_attend, routing: Routing | None = None):
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        if self.plan.fused_ops and x.is_cuda:  # residual adds fused into the next RMSNorm
            return self._forward_fused(x, cos, sin, attend, routing)
        for layer in self.layers:
            x = layer(x, cos, sin, attend, routing)
        return self.norm(x)

    def _forward_fused(self, x, cos, sin, attend, routing):
        """The same computation with each residual add done inside the next norm's kernel;
        a norm feeding a real-FP8 linear also quantizes its output (one launch fewer)."""
        from quantroll.kernels.fused import add_rmsnorm

        delta, gpu = None, self.plan.kernels.gpu
        for layer in self.layers:
            x, h = add_rmsnorm(x, delta, layer.input_layernorm.weight, layer.input_layernorm.eps,
                               quantize=takes_fp8_activation(layer.self_attn.qkv_proj), kernels=gpu)
            a = layer.self_attn(h, cos, sin, attend)
            quantize, keep_bf16 = layer.mlp_input()
            x, h = add_rmsnorm(x, a, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps,
                               quantize=quantize, keep_bf16=keep_bf16, kernels=gpu)
            delta = layer.mlp(h, routing) if isinstance(layer.mlp, SparseMoE) else layer.mlp(h)
        return add_rmsnorm(x, delta, self.norm.weight, self.norm.eps, kernels=gpu)[1]


class CausalLM(torch.nn.Module):
    """A decoder-only LM of any registered family (transformers' ``*ForCausalLM``). ``forward`` returns logits; ``hidden`` + ``logits`` split it
    so that an engine computes the vocabulary projection only where it samples."""

    plan: ForwardPlan = DEFAULT_PLAN  # handed over once by prepare_

    def __init__(self, cfg: ModelConfig, fmt_for: FormatFor = bf16_everywhere, dtype=torch.bfloat16, device=None):
        super().__init__()
        self.config = cfg
        fmt_for = unless_kept(fmt_for)  # what stays BF16 by name: the one rule (checkpoint/bf16_rule.py)
        self.model = DecoderStack(cfg, fmt_for, dtype, device)
        self.lm_head = QLinear(cfg.hidden_size, cfg.vocab_size, fmt=fmt_for("lm_head"), name="lm_head", dtype=dtype,
                               device=device)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def kernels(self) -> KernelConfig:
        return self.plan.kernels

    @torch.no_grad()
    def prepare_(self, plan: ForwardPlan) -> None:
        """Lay the model out as ``plan`` says and hand it to every module, once: fuse q/k/v
        and gate/up (the parts become views), then give every module the plan (the fused
        linears too), then stack the MoE experts. The one place a model's forward is chosen;
        nothing changes a module's computation after it. Preparing again with the same plan
        does nothing; with another, it is refused (fusing and stacking cannot be undone:
        build a fresh model)."""
        if not isinstance(plan, ForwardPlan):
            raise QuantrollError(f"CausalLM.prepare_ takes a ForwardPlan, got {type(plan).__name__}")
        if self.__dict__.get("plan") is not None:
            if self.plan == plan:
                return
            raise QuantrollError("this model was already prepared with another forward plan; load a fresh model for "
                                 "each plan (an engine and a trainer each hold their own)")
        if plan.fuse_projections:
            self._fuse_projections()
        for module in self.modules():
            if hasattr(module, "plan"):
                module.plan = plan
        if plan.stack_experts:
            for module in self.modules():
                if isinstance(module, SparseMoE):
                    module.stack_experts_()

    def default_attend(self) -> Attend:
        """Attention over the given tokens alone (no cache): the trainer's causal forward."""
        return invariant_causal_attend(self.kernels) if self.kernels.batch_invariant else causal_attend

    def hidden(self, input_ids, positions=None, attend: Attend | None = None, routing: Routing | None = None):
        attend = attend or self.default_attend()
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.model(input_ids, positions, attend, routing)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def forward(self, input_ids, positions=None, attend: Attend | None = None, routing: Routing | None = None):
        return self.logits(self.hidden(input_ids, positions, attend, routing))

    def _fuse_projections(self) -> None:
        """Run q/k/v and gate/up as one GEMM each (inference: the parts become views)."""
        for module in self.modules():
            if isinstance(module, MLP) and ".experts." in module.gate_proj.name:
                continue  # experts run stacked (grouped GEMM) or one by one, never fused pairwise
            if isinstance(module, (Attention, MLP)):
                module.fuse_()

    def quantized_linears(self) -> dict[str, QLinear]:
        return {m.name: m for m in self.modules() if isinstance(m, QLinear) and m.quantized}
