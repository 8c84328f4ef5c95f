"""A static KV cache: one [B, S, Hkv, D] key and value tensor per layer.

Static shapes keep decode capturable in a CUDA graph: every step writes each
sequence's new key/value at its own position and attends over the whole buffer with
a mask, so no shape depends on how far each sequence has come.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantroll.model.config import ModelConfig


def kv_cache_bytes(cfg: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype) -> int:
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * torch.finfo(dtype).bits // 8
    return batch * seq_len * per_token


class KVCache:
    def __init__(self, cfg: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype, device):
        shape = (batch, seq_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.batch, self.seq_len = batch, seq_len
        self.positions: torch.Tensor | None = None  # [B, T] positions of the tokens being processed
        self.slots = torch.arange(seq_len, device=device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k, v at ``self.positions`` and attend causally over everything cached.

        A query at position p sees the cached keys at positions <= p of its own row.
        """
        pos = self.positions
        b, t = pos.shape
        rows = torch.arange(b, device=pos.device)[:, None].expand(b, t)
        self.k[layer][rows, pos] = k
        self.v[layer][rows, pos] = v
        mask = self.slots[None, None, :] <= pos[:, :, None]  # [B, T, S]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), self.k[layer].transpose(1, 2), self.v[layer].transpose(1, 2),
            attn_mask=mask[:, None], enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.transpose(1, 2)
