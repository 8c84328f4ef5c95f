"""The paged KV cache: one pool of fixed-size blocks per layer, and attention over it.

Key and value of a position live at a *slot*, ``block * block_size + offset``, of the
layer's pools: keys [num_blocks, block_size, Hkv, D]; values the same, except in an FP8
cache, where they are [num_blocks, Hkv, D, block_size] (positions minor, as vLLM's first
value cache was): the P.V product reduces over positions, and Hopper's shared-memory
matrix loads transpose 16-bit elements but not 8-bit ones, so FP8 values stored
positions-major reach the tensor cores one byte at a time (measured: ~1.9x the bytes'
time; compiled PTX: 128 single-byte shared loads per thread per tile, none with this
layout). A sequence's block table lists its blocks in position order. Every forward
pass, prefill (any number of tokens of several sequences, flattened into one row) or
decode (one token per sequence), gives the cache an ``AttentionBatch``: where each new
token's key/value goes (``slots``), and for each sequence its block table, its context
length after this pass, and where its queries start in the flattened batch. Attention then writes the new keys/values and attends
each query to its own sequence's positions up to its own (causal).

Two paths compute it: Triton kernels on the GPU (kernels/paged_attention.py) and the
reference below (any device): gather each sequence's keys through its block table and
run one masked SDPA. With ``kv_cache_dtype="fp8_e4m3"`` the pool holds E4M3 codes and a
float32 scale per position and head (formats/kv_fp8.py), stored [num_blocks, Hkv,
block_size] (a head's scales of a block contiguous); the reference dequantizes
exactly, which is the CPU's emulation of an FP8 KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quantroll.errors import QuantrollError
from quantroll.formats.kv_fp8 import KV_CODE_DTYPE, dequantize_kv, kv_bytes_per_element, quantize_kv
from quantroll.kernels.quantize import triton_available
from quantroll.model import invariant
from quantroll.model.config import ModelConfig
from quantroll.model.kernel_config import DEFAULT_KERNELS, KernelConfig

KV_CACHE_DTYPES = ("bf16", "fp8_e4m3")
_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "auto": "bf16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}


def kv_cache_dtype_name(name: str) -> str:
    """The canonical name ("bf16": the engine's own dtype, or "fp8_e4m3") of a KV dtype."""
    if name not in _ALIASES:
        raise QuantrollError(f"unknown KV cache dtype {name!r}; choose bf16 or fp8_e4m3")
    return _ALIASES[name]


@dataclass(frozen=True)
class CacheConfig:
    """How big the pool is and what it stores.

    memory_gb: the pool's budget in GiB; None sizes it from the device: ``memory_fraction``
    of the GPU memory free when the pool is allocated (at the first generate(), after the
    weights and, in training, the trainer are loaded), ``cpu_memory_gb`` on a CPU (whose
    pages are used only as blocks are first written)."""

    kv_cache_dtype: str = "bf16"
    block_size: int = 16
    memory_gb: float | None = None
    memory_fraction: float = 0.85
    cpu_memory_gb: float = 1.0
    prefix_sharing: bool = True  # reuse the KV of identical prompt prefixes (RL's n samples per prompt)

    def __post_init__(self):
        object.__setattr__(self, "kv_cache_dtype", kv_cache_dtype_name(self.kv_cache_dtype))
        if not isinstance(self.block_size, int) or self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise QuantrollError(f"KV block size must be a power of two >= 1, got {self.block_size!r}")
        if self.memory_gb is not None and not self.memory_gb > 0:
            raise QuantrollError(f"KV cache memory budget must be > 0 GiB, got {self.memory_gb!r}")
        if not 0 < self.memory_fraction <= 1:
            raise QuantrollError(f"KV cache memory fraction must be in (0, 1], got {self.memory_fraction!r}")


def kv_bytes_per_token(cfg: ModelConfig, kv_cache_dtype: str, dtype: torch.dtype) -> float:
    """Bytes of KV cache one position takes in every layer, scales included."""
    elem = kv_bytes_per_element(dtype if kv_cache_dtype == "bf16" else kv_cache_dtype, cfg.head_dim)
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem


@dataclass
class AttentionBatch:
    """One forward pass's view of the cache (tensors on the cache's device)."""

    slots: torch.Tensor  # [N] int64: where each token's key/value is written (flattened order)
    block_tables: torch.Tensor  # [S, max_blocks] int32
    context_lens: torch.Tensor  # [S] int32: positions each sequence attends to, this pass's included
    query_starts: torch.Tensor | None  # [S + 1] int32 offsets of each sequence's queries; None: one each (decode)
    max_query: int = 1  # host-side bounds, for kernel grids and the reference's padding
    max_context: int = 0


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, kv_cache_dtype: str,
                 device, gpu_kernels: bool, kernels: KernelConfig = DEFAULT_KERNELS):
        self.kernels = kernels
        self.num_blocks, self.block_size, self.dtype, self.kv_cache_dtype = num_blocks, block_size, dtype, kv_cache_dtype
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.gpu_kernels = gpu_kernels
        # batch-invariant attention through the Triton prefill kernel (the trainer's too) on a GPU
        self.invariant_kernels = kernels.batch_invariant and torch.device(device).type == "cuda" and triton_available()
        store = KV_CODE_DTYPE if kv_cache_dtype == "fp8_e4m3" else dtype
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        layers = cfg.num_hidden_layers
        # a CPU pool is left uninitialized, so that its pages cost memory only once used (the
        # reference zeroes what it gathers beyond a sequence's keys); a GPU pool starts zeroed:
        # the kernels read an FP8 cache's values in whole blocks, and need every code finite
        alloc = torch.zeros if torch.device(device).type == "cuda" else torch.empty
        self.values_positions_minor = kv_cache_dtype == "fp8_e4m3"
        v_shape = (num_blocks, cfg.num_key_value_heads, cfg.head_dim, block_size) if self.values_positions_minor \
            else shape
        self.k = [alloc(shape, dtype=store, device=device) for _ in range(layers)]
        self.v = [alloc(v_shape, dtype=store, device=device) for _ in range(layers)]
        self.k_scale = self.v_scale = None
        if kv_cache_dtype == "fp8_e4m3":
            # [num_blocks, Hkv, block_size]: one head's scales of a block are contiguous, so a key
            # tile's scales arrive in whole sectors (position-major, each 4-byte scale cost a
            # 32-byte sector shared with the other heads' programs)
            s_shape = (num_blocks, cfg.num_key_value_heads, block_size)
            self.k_scale = [alloc(s_shape, dtype=torch.float32, device=device) for _ in range(layers)]
            self.v_scale = [alloc(s_shape, dtype=torch.float32, device=device) for _ in range(layers)]
        self.batch: AttentionBatch | None = None

    @property
    def quantized(self) -> bool:
        return self.k_scale is not None

    @property
    def nbytes(self) -> int:
        tensors = self.k + self.v + (self.k_scale + self.v_scale if self.quantized else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    # -- the model's Attend interface --------------------------------------------------
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, T, H, D], k/v [B, T, Hkv, D] in the batch's flattened token order -> [B, T, H, D]."""
        shape = q.shape
        q, k, v = q.reshape(-1, *shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
        self.write(layer, k, v)
        if self.kernels.batch_invariant:
            out = self.invariant_attend(layer, q)
        elif self.gpu_kernels:
            from quantroll.kernels import paged_attention

            out = paged_attention.attend(q, self, layer, self.batch)
        else:
            out = self.reference_attend(layer, q)
        return out.reshape(shape)

    @property
    def attend_qkv(self):
        """The GPU decode path from the fused q/k/v projection (QK-norms where the model has
        them, rotary and the cache write in one kernel, then paged attention), or None where
        the model's own ops run. Norm weights None: a family without QK-norm. ``quantize``: the
        caller's o_proj takes an Fp8Activation; the attention hands one over where each head
        is one quantization group (else BF16, which the linear quantizes itself)."""
        if not self.gpu_kernels or self.head_dim & (self.head_dim - 1):
            return None
        from quantroll.kernels import paged_attention

        fuse = paged_attention.quantizes_output(self.head_dim)
        return lambda layer, qkv, q_w, k_w, eps, cos, sin, heads, kv_heads, head_dim, quantize=False: \
            paged_attention.decode_from_qkv(qkv, q_w, k_w, eps, cos, sin, self, layer, self.batch,
                                            quantize=quantize and fuse)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [N, Hkv, D] at the batch's slots (quantized for an FP8 cache)."""
        slots = self.batch.slots
        flat = (-1, self.kv_heads, self.head_dim)
        if self.quantized:
            for pool, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
                codes, s = quantize_kv(x)  # copied as bytes: not every device indexes float8 tensors
                if pool is self.v:
                    block, offset = slots // self.block_size, slots % self.block_size
                    pool[layer].view(torch.uint8)[block, :, :, offset] = codes.view(torch.uint8)
                else:
                    pool[layer].view(torch.uint8).view(flat).index_copy_(0, slots, codes.view(torch.uint8))
                scales[layer][slots // self.block_size, :, slots % self.block_size] = s
        else:
            self.k[layer].view(flat).index_copy_(0, slots, k.to(self.dtype))
            self.v[layer].view(flat).index_copy_(0, slots, v.to(self.dtype))

    def scales_at(self, scales: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """An FP8 cache's scales of one layer's pool at ``slots`` (any shape) -> [*slots.shape, Hkv]."""
        return scales[slots // self.block_size, :, slots % self.block_size]

    def gather(self, layer: int, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at ``slots`` (any shape) -> [*slots.shape, Hkv, D] in ``dtype``."""
        flat = (-1, self.kv_heads, self.head_dim)
        if self.quantized:
            k = self.k[layer].view(torch.uint8).view(flat)[slots].view(KV_CODE_DTYPE)
            v = self.v[layer].view(torch.uint8)[slots // self.block_size, :, :, slots % self.block_size]
            v = v.view(KV_CODE_DTYPE)
        else:
            k, v = self.k[layer].view(flat)[slots], self.v[layer].view(flat)[slots]
        if self.quantized:
            k = dequantize_kv(k, self.scales_at(self.k_scale[layer], slots))
            v = dequantize_kv(v, self.scales_at(self.v_scale[layer], slots))
        return k.to(dtype), v.to(dtype)

    def _gathered(self, layer: int, q: torch.Tensor):
        """Each sequence's keys/values 0 .. max_context - 1 (zeros past its context), its queries
        padded to max_query, their absolute positions and which are real:
        (k, v [S, C, Hkv, D], q [S, Tq, H, D], positions [S, Tq], valid [S, Tq])."""
        b = self.batch
        s = b.block_tables.shape[0]
        dev = q.device
        starts = b.query_starts if b.query_starts is not None else torch.arange(s + 1, device=dev, dtype=torch.int32)
        q_lens = (starts[1:] - starts[:-1]).long()
        ctx = b.context_lens.long()
        keys = torch.arange(b.max_context, device=dev)
        table = b.block_tables.long().gather(1, (keys // self.block_size).clamp(max=b.block_tables.shape[1] - 1)
                                             .expand(s, -1))
        k, v = self.gather(layer, table * self.block_size + keys % self.block_size, q.dtype)
        known = (keys[None, :] < ctx[:, None])[:, :, None, None]
        k, v = torch.where(known, k, 0), torch.where(known, v, 0)  # slots never written may hold anything
        rows = torch.arange(b.max_query, device=dev)
        valid = rows[None, :] < q_lens[:, None]
        index = (starts[:-1, None].long() + rows[None, :]).clamp(max=q.shape[0] - 1)
        return k, v, q[index], (ctx - q_lens)[:, None] + rows[None, :], valid

    def invariant_attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """reference_attend in its batch-invariant form (model/invariant.attention): a key's
        place in every reduction is its absolute position, so one-token decode, a prefill
        chunk and the trainer's causal pass over the same keys give the same bits."""
        if self.invariant_kernels:
            from quantroll.kernels import paged_attention

            return paged_attention.invariant_attention(q, self, layer, self.batch, self.kernels.invariant_attention)
        k, v, qp, positions, valid = self._gathered(layer, q)
        out = invariant.attention(qp, k, v, positions, self.kernels.attention_elements)
        return out[valid]

    def reference_attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q [N, H, D] (flattened) -> [N, H, D]: each sequence's queries against its keys
        0 .. its own position, gathered through its block table, in one masked SDPA."""
        k, v, qp, query_pos, valid = self._gathered(layer, q)  # [S, C, Hkv, D] x 2, [S, Tq, H, D], [S, Tq] x 2
        keys = torch.arange(k.shape[1], device=q.device)
        ctx = self.batch.context_lens.long()
        mask = keys[None, None, :] <= query_pos[:, :, None]
        mask &= keys[None, None, :] < ctx[:, None, None]
        mask |= ~valid[:, :, None] & (keys[None, None, :] == 0)  # padded queries: any key, never used
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask[:, None], enable_gqa=self.heads != self.kv_heads)
        out = out.transpose(1, 2)  # [S, Tq, H, D]
        return out[valid]
