"""A static KV cache: one [B, S, Hkv, D] key and value tensor per layer.

Static shapes keep decode capturable in a CUDA graph: every step writes each
sequence's new key/value at its own position (``positions``, a tensor updated in
place) and attends over that sequence's valid keys only. Prefill always starts at
position 0, so it attends causally over its own tokens (padding sits at the end of a
row and no valid token sees it); decode uses the Triton kernel on GPU and a masked
SDPA over the buffer elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantroll.model.config import ModelConfig


def kv_cache_bytes(cfg: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype) -> int:
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * torch.finfo(dtype).bits // 8
    return batch * seq_len * per_token


class KVCache:
    def __init__(self, cfg: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype, device, decode_kernel: bool = False):
        shape = (batch, seq_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.batch, self.seq_len, self.decode_kernel, self.head_dim = batch, seq_len, decode_kernel, cfg.head_dim
        self.positions: torch.Tensor | None = None  # [B, T] positions of the tokens being processed
        self.slots = torch.arange(seq_len, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attend(layer, q, k, v)

    @property
    def attend_qkv(self):
        """The fused decode path (GPU, power-of-two head_dim), or None."""
        return self._attend_qkv if self.decode_kernel and self.head_dim & (self.head_dim - 1) == 0 else None

    def _attend_qkv(self, layer, qkv, q_norm_w, k_norm_w, eps, cos, sin, heads, kv_heads, head_dim, quantize=False):
        """Decode from the fused q/k/v projection [B, (H + 2 Hkv) D]: one kernel normalizes,
        rotates and caches k/v, another attends; with FUSE_QKV_ATTENTION one kernel does both,
        and ``quantize`` (the caller's o_proj takes an Fp8Activation) then also has it
        quantize its output (the same function; on the GPU the two orders differ in last
        bits of q and k, see decode_attention.FUSE_QKV_ATTENTION)."""
        from quantroll.kernels import decode_attention as attention
        from quantroll.kernels.fused import FP8_GROUP, qk_norm_rope_cache

        pos = self.positions[:, 0]
        if attention.FUSE_QKV_ATTENTION and attention.fuses_qkv(head_dim):
            return attention.decode_attention_qkv(qkv, q_norm_w, k_norm_w, eps, cos, sin, self.k[layer], self.v[layer],
                                                  self.rows[:, 0], pos, heads, kv_heads, head_dim,
                                                  quantize=quantize and head_dim == FP8_GROUP)
        q = qk_norm_rope_cache(qkv, q_norm_w, k_norm_w, eps, cos, sin, self.k[layer], self.v[layer], self.rows[:, 0],
                               pos, heads, kv_heads, head_dim)
        return attention.decode_attention(q, self.k[layer], self.v[layer], pos + 1)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pos = self.positions
        rows = self.rows.expand_as(pos)
        self.k[layer][rows, pos] = k
        self.v[layer][rows, pos] = v
        if q.shape[1] > 1:  # prefill from position 0
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=q.shape[2] != k.shape[2])
            return out.transpose(1, 2)
        if self.decode_kernel:
            from quantroll.kernels.decode_attention import decode_attention

            return decode_attention(q[:, 0], self.k[layer], self.v[layer], pos[:, 0] + 1)[:, None]
        mask = self.slots[None, None, :] <= pos[:, :, None]  # [B, 1, S]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), self.k[layer].transpose(1, 2), self.v[layer].transpose(1, 2),
            attn_mask=mask[:, None], enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.transpose(1, 2)
