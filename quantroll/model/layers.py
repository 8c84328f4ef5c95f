"""Decoder building blocks: RMSNorm, rotary attention with GQA (QK-norm and biases as
the config's ``Block`` says), the SwiGLU MLP.

Attention delegates the score/softmax/value step to an ``attend`` callable, so the
same layer serves the trainer (whole sequences, causal) and the engine (a KV cache):
``attend(layer_idx, q, k, v) -> out`` with q [B, T, H, D] and k, v [B, T, Hkv, D].
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

from quantroll.formats import Format
from quantroll.kernels.backends import hardware_backend
from quantroll.kernels.quantize import triton_available
from quantroll.model import invariant
from quantroll.model.config import ModelConfig
from quantroll.model.kernel_config import DEFAULT_PLAN, ForwardPlan, KernelConfig
from quantroll.model.linear import QLinear, can_fuse, fuse_linears
from quantroll.model.rope import apply_rotary

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
FormatFor = Callable[[str], "Format | None"]


def causal_attend(layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Full causal attention over the given tokens (no cache)."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    return out.transpose(1, 2)


def invariant_causal_attend(kernels: KernelConfig) -> Attend:
    """Full causal attention in its batch-invariant form (the trainer's side of true on-policy):
    on a GPU with Triton the engine's own attention kernel over the sequences' keys
    (kernels/paged_attention.invariant_causal_attention), elsewhere the tree-sum torch form;
    the backward is the ordinary attention's either way."""
    def attend(layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.is_cuda and triton_available():
            from quantroll.kernels.paged_attention import invariant_causal_attention

            return invariant.straight_through(
                lambda a, b, c: invariant_causal_attention(a, b, c, kernels.invariant_attention),
                lambda a, b, c: causal_attend(layer_idx, a, b, c), q, k, v)
        return invariant.causal_attention(q, k, v, kernels.attention_elements)
    return attend


class RMSNorm(torch.nn.Module):
    plan: ForwardPlan = DEFAULT_PLAN  # the model's, handed over by CausalLM.prepare_

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        if plan.kernels.batch_invariant:
            return invariant.rms_norm(x, self.weight, self.eps)
        if plan.fused_ops and x.is_cuda:  # one Triton kernel
            from quantroll.kernels.fused import add_rmsnorm

            return add_rmsnorm(x, None, self.weight, self.eps, kernels=plan.kernels.gpu)[1]
        return invariant.rms_norm_reference(x, self.weight, self.eps)


def linear(prefix: str, fmt_for: FormatFor, n_in: int, n_out: int, bias: bool, dtype, device) -> QLinear:
    return QLinear(n_in, n_out, bias=bias, fmt=fmt_for(prefix), name=prefix, dtype=dtype, device=device)


def takes_fp8_activation(layer: QLinear | None) -> bool:
    """Whether the fused kernel producing ``layer``'s input should hand it over already
    quantized (an Fp8Activation): only a block-FP8 linear on the real FP8 GEMMs reads
    codes + scales, and the kernels quantize whole 1x128 groups only. Read from the
    layer's plan (its backend) at each call."""
    if layer is None or layer.format is None or layer.backend != "fp8":
        return False
    # "fp8" is block FP8's real GEMM (registered with it when kernels/fp8_linear.py was
    # imported, as a layer on that backend needs); any other format set to it does not qualify
    hardware = hardware_backend(layer.format)
    if hardware is None or hardware.backend != layer.backend:
        return False
    from quantroll.kernels import fused

    return layer.in_features % fused.FP8_GROUP == 0 and layer.plan.kernels.gpu.fuse_activation_quant


def _on_gpu(x) -> bool:
    """x.is_cuda for a tensor or for an Fp8Activation (which only the GPU kernels make)."""
    return x.is_cuda if isinstance(x, torch.Tensor) else x.codes.is_cuda


def _as_rows(out, b: int, t: int):
    """The decode attention's output as o_proj's input [B, T, H*D]: a BF16 tensor
    reshaped, or an Fp8Activation (codes already [B*T, H*D]) relabelled with that shape,
    which the FP8 linear gives its output."""
    if isinstance(out, torch.Tensor):
        return out.reshape(b, t, -1)
    return dataclasses.replace(out, shape=torch.Size([b, t, out.codes.shape[-1]]))


class Attention(torch.nn.Module):
    plan: ForwardPlan = DEFAULT_PLAN  # the model's, handed over by CausalLM.prepare_

    def __init__(self, cfg: ModelConfig, layer_idx: int, fmt_for: FormatFor, dtype, device=None):
        super().__init__()
        p = f"model.layers.{layer_idx}.self_attn."
        h, hd, nh, nkv, block = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.block
        self.layer_idx, self.head_dim = layer_idx, hd
        self.q_proj = linear(p + "q_proj", fmt_for, h, nh * hd, block.qkv_bias, dtype, device)
        self.k_proj = linear(p + "k_proj", fmt_for, h, nkv * hd, block.qkv_bias, dtype, device)
        self.v_proj = linear(p + "v_proj", fmt_for, h, nkv * hd, block.qkv_bias, dtype, device)
        self.o_proj = linear(p + "o_proj", fmt_for, nh * hd, h, block.o_bias, dtype, device)
        # QK-norm: RMSNorm over head_dim on q and k before rotary (None where the family has none)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, device) if block.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, device) if block.qk_norm else None

        self.qkv_proj: QLinear | None = None  # set by fuse_(): one GEMM for q, k and v
        self.heads, self.kv_heads, self.eps = nh, nkv, cfg.rms_norm_eps

    def fuse_(self) -> None:
        parts = [self.q_proj, self.k_proj, self.v_proj]
        if self.qkv_proj is None and can_fuse(parts):
            self.qkv_proj = fuse_linears(parts, self.q_proj.name.replace("q_proj", "qkv_proj"))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """x: BF16, or an Fp8Activation when qkv_proj takes one (fused GPU path; only its shape is read here)."""
        b, t, _ = x.shape
        attend_qkv = getattr(attend, "attend_qkv", None)
        if attend_qkv is not None and self.qkv_proj is not None and t == 1:
            # decode on GPU: q/k/v biases already added by qkv_proj; (norms,) rotary and the cache write in one
            # kernel, then attention (or all in one, which may hand o_proj its input already quantized)
            q_w, k_w = (self.q_norm.weight, self.k_norm.weight) if self.q_norm is not None else (None, None)
            out = attend_qkv(self.layer_idx, self.qkv_proj(x).view(b, -1), q_w, k_w,
                             self.eps, cos, sin, self.heads, self.kv_heads, self.head_dim,
                             quantize=takes_fp8_activation(self.o_proj))
            return self.o_proj(_as_rows(out, b, t))
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split(
                [self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = (p.reshape(b, t, -1, self.head_dim) for p in (q, k, v))
        if self.q_norm is None:  # rotary alone: elementwise, so batch-invariant as it stands
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        elif self.plan.kernels.batch_invariant:
            q = invariant.norm_rope(q, self.q_norm.weight, self.eps, cos, sin)
            k = invariant.norm_rope(k, self.k_norm.weight, self.eps, cos, sin)
        else:
            q, k = apply_rotary(self.q_norm(q), cos, sin), apply_rotary(self.k_norm(k), cos, sin)
        return self.o_proj(attend(self.layer_idx, q, k, v).reshape(b, t, -1))


class MLP(torch.nn.Module):
    plan: ForwardPlan = DEFAULT_PLAN  # the model's, handed over by CausalLM.prepare_

    def __init__(self, prefix: str, hidden: int, inter: int, fmt_for: FormatFor, dtype, device=None,
                 bias: bool = False):
        super().__init__()
        self.gate_proj = linear(prefix + "gate_proj", fmt_for, hidden, inter, bias, dtype, device)
        self.up_proj = linear(prefix + "up_proj", fmt_for, hidden, inter, bias, dtype, device)
        self.down_proj = linear(prefix + "down_proj", fmt_for, inter, hidden, bias, dtype, device)
        self.gate_up_proj: QLinear | None = None  # set by fuse_(): one GEMM for gate and up

    def fuse_(self) -> None:
        parts = [self.gate_proj, self.up_proj]
        if self.gate_up_proj is None and can_fuse(parts):
            self.gate_up_proj = fuse_linears(parts, self.gate_proj.name.replace("gate_proj", "gate_up_proj"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: BF16, or an Fp8Activation when gate_up_proj takes one (fused GPU path)."""
        plan = self.plan
        if self.gate_up_proj is not None and plan.fused_ops and _on_gpu(x):  # silu * up in one Triton kernel
            from quantroll.kernels.fused import silu_mul

            return self.down_proj(silu_mul(self.gate_up_proj(x), quantize=takes_fp8_activation(self.down_proj),
                                           kernels=plan.kernels.gpu))
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if plan.kernels.batch_invariant:
            return self.down_proj(invariant.silu_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)
