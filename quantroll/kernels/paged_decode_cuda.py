"""The CUDA decode attention over an FP8 KV cache (cuda/paged_decode_fp8.cu): where it
applies, and its launch. Chosen by ``PagedTiles.decode_kernel = "cuda"``; why it exists
and how it lays out the work: the source's header. A cache it cannot read is refused with
the reason (never a silent fall back to the Triton kernel: the two round differently)."""

from __future__ import annotations

import torch

from quantroll.kernels import cuda_jit

SOURCE = "paged_decode_fp8.cu"
HEAD_DIM = 128  # the kernel's compile-time head size
BLOCK_SIZE = 16  # positions per cache block
MAX_GROUP = 16  # query heads per KV head: the 16 rows of mma.sync
WARPS = (4, 2)  # the compiled variants (paged_decode_fp8_w<WARPS>)
# one warp's stage: 32 keys x 128 code bytes, two value blocks (2 KB + a 64-byte bank shift
# each), the two blocks' key and value scales; two stages per warp. The final reduction
# reuses them: [warps, 16, 128] float32 partial outputs, [warps, 16, 2] max / sum, [warps] amax
STAGE_BYTES = 32 * HEAD_DIM + 2 * (HEAD_DIM * BLOCK_SIZE + 64) + 2 * 2 * BLOCK_SIZE * 4


def shared_bytes(warps: int) -> int:
    """Dynamic shared memory of a block: the warps' stages, which the final reduction
    ([warps, 16, 128] float32 partial outputs and [warps, 16, 2] max / sum) reuses."""
    return max(warps * 2 * STAGE_BYTES, warps * 16 * HEAD_DIM * 4 + warps * 16 * 2 * 4 + warps * 4)


def unsupported_reason(cache, q: torch.Tensor) -> str | None:
    """None when the kernel reads this cache for these queries, else why not (one line)."""
    if not cache.quantized:
        return "it reads an FP8 (E4M3) cache only"
    if cache.head_dim != HEAD_DIM:
        return f"it is compiled for head_dim {HEAD_DIM}, the cache has {cache.head_dim}"
    if cache.block_size != BLOCK_SIZE:
        return f"it is compiled for cache blocks of {BLOCK_SIZE} positions, the cache has {cache.block_size}"
    if not cache.values_positions_minor:
        return "it reads values stored positions-minor ([blocks, Hkv, D, block_size])"
    group = q.shape[1] // cache.kv_heads
    if group > MAX_GROUP or q.shape[1] % cache.kv_heads:
        return f"it serves up to {MAX_GROUP} query heads per KV head, got {q.shape[1]} over {cache.kv_heads}"
    if q.dtype != torch.bfloat16 or q.stride(-1) != 1:
        return f"it takes BF16 queries with contiguous heads, got {q.dtype}"
    if q.device.type != "cuda":
        return "it runs on a CUDA device"
    return cuda_jit.unavailable_reason(q.device)


def decode_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
               tables: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, part_o: torch.Tensor,
               part_ml: torch.Tensor, splits: int, warps: int = 4, codes: torch.Tensor | None = None,
               code_scales: torch.Tensor | None = None) -> None:
    """One launch over q [B, H, D]: with one split the result goes to ``out`` [B, H, D]
    (BF16), or with ``codes`` [B, H * D] E4M3 and ``code_scales`` [B, H] (outer-dim-major,
    fp8_activation_buffers) to those, quantized as a block-FP8 linear quantizes that BF16
    output (each head one 1x128 group); with several, the per-split partials (O / l, and
    (m, l) in natural-log units) go to ``part_o`` [B, H, splits, D] and ``part_ml``
    [B, H, splits, 2], for the Triton merge. ``unsupported_reason`` must have said None."""
    if warps not in WARPS:
        raise ValueError(f"CUDA decode attention: warps must be one of {WARPS}, got {warps}")
    if codes is not None and splits != 1:
        raise ValueError("CUDA decode attention quantizes its output in one split only (the merge kernel does for more)")
    b, h, _ = q.shape
    hkv = k.shape[2]
    module = cuda_jit.load(SOURCE, q.device)
    module.launch(f"paged_decode_fp8_w{warps}", (b, hkv, splits), (32 * warps, 1, 1),
                  q, q.stride(0), q.stride(1), k, v, k_scale, v_scale, tables, tables.stride(0), lengths,
                  out, out.stride(0), out.stride(1), part_o, part_ml, hkv, h // hkv, splits,
                  0 if codes is None else codes, 0 if code_scales is None else code_scales,
                  0 if codes is None else codes.stride(0), 0 if code_scales is None else code_scales.stride(-1),
                  shared_bytes=shared_bytes(warps))
