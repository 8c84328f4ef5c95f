"""The CUDA decode attention over an FP8 KV cache (cuda/paged_decode_fp8.cu): where it
applies, its launch shape, and its launch. Why it exists and how it lays out the work: the
source's header. It is the engine's decode over an FP8 cache (``PagedTiles.decode_kernel =
"cuda"``, kernels/choices.py) where ``unsupported_reason`` says None when the engine is
built; elsewhere the engine takes the Triton kernel and logs why (engine/plan.py). A launch
for a cache it cannot read is refused with the reason, never switched to the Triton kernel
mid-run (the two round differently)."""

from __future__ import annotations

import functools

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


def unsupported_reason(*, kv_cache_dtype: str, head_dim: int, block_size: int, heads: int, kv_heads: int,
                       dtype: torch.dtype, device: torch.device) -> str | None:
    """None when the kernel serves this cache and these queries on ``device``, else why not
    (one line). Asked once, when an engine is built (engine/plan.py: the Triton kernel
    serves where this is not None, and the engine logs why); a launch checks only the
    layout (cache_unsupported_reason), not the machine again."""
    return (_layout_reason(kv_cache_dtype, head_dim, block_size, heads, kv_heads, dtype) or _off_cuda(device)
            or cuda_jit.unavailable_reason(device))


def _off_cuda(device: torch.device) -> str | None:
    return None if torch.device(device).type == "cuda" else "it runs on a CUDA device"


def _layout_reason(kv_cache_dtype: str, head_dim: int, block_size: int, heads: int, kv_heads: int,
                   dtype: torch.dtype) -> str | None:
    if kv_cache_dtype != "fp8_e4m3":
        return "it reads an FP8 (E4M3) cache only"
    if head_dim != HEAD_DIM:
        return f"it is compiled for head_dim {HEAD_DIM}, the cache has {head_dim}"
    if block_size != BLOCK_SIZE:
        return f"it is compiled for cache blocks of {BLOCK_SIZE} positions, the cache has {block_size}"
    if heads % kv_heads or heads // kv_heads > MAX_GROUP:
        return f"it serves up to {MAX_GROUP} query heads per KV head, got {heads} over {kv_heads}"
    if dtype != torch.bfloat16:
        return f"it takes BF16 queries, the engine computes in {dtype}"
    return None


def build_reason(device: torch.device) -> str | None:
    """None when the kernel compiles and loads on ``device`` and its launch rule has read the
    driver's occupancy, else why not, in one line (the compiler's whole output is in the
    exception). Done once per process and device, when an engine is built: no compile or
    driver query is left for a decode step (or a graph capture) to do."""
    device = torch.device(device)
    try:
        _slots(device.index if device.index is not None else torch.cuda.current_device())
    except (RuntimeError, OSError) as err:  # CompileError is a RuntimeError
        return " ".join(f"building {SOURCE} failed: {err}".split())[:300]
    return None


def cache_unsupported_reason(cache, q: torch.Tensor) -> str | None:
    """What a launch checks: the cache's layout (values positions-minor: its FP8 layout) and
    the queries [B, H, D] (contiguous heads, on a CUDA device). The machine (nvcc, the build)
    was checked when the engine was built; a launch without it fails in cuda_jit.load."""
    if cache.quantized and not cache.values_positions_minor:
        return "it reads values stored positions-minor ([blocks, Hkv, D, block_size])"
    if q.stride(-1) != 1:
        return "it takes queries with contiguous heads"
    return _layout_reason("fp8_e4m3" if cache.quantized else "bf16", cache.head_dim, cache.block_size, q.shape[1],
                          cache.kv_heads, q.dtype) or _off_cuda(q.device)


# (sequence, KV head, split) programs per SM the split rule (paged_attention.decode_splits) aims at
# for this kernel: measured on an H100
# (bench/paged_attention.py --shape qwen3-8b --sweep-layouts cuda, 2026-12-06), 16 sequences x 8
# KV heads over 2048 positions took 34.2 us in 2 splits (4 warps), 40.7 in 4; over 16384, 204 and 222.
PROGRAMS_PER_SM = 2


def wave_efficiency(programs: int, slots: int) -> float:
    """The share of the launch's block slots (SMs x resident blocks, times its waves) that
    hold a program: 1 when the programs fill their last wave."""
    return programs / (slots * -(-programs // slots))


def choose_warps(programs: int, slots_by_warps: dict[int, int]) -> int:
    """The warp count whose waves are fullest (wave_efficiency), the fewer warps on a tie
    (within 1%): more blocks resident per SM, the same bytes in flight. On an H100 (168
    registers: 3 blocks per SM at 4 warps, 6 at 2) it chose the measured best at every
    shape of the 8B sweep (2026-12-06): 2 warps for 512 and 2048 programs, 4 for 256 and 1024."""
    eff = {w: wave_efficiency(programs, slots) for w, slots in slots_by_warps.items()}
    best = max(eff.values())
    return min(w for w, e in eff.items() if e >= best - 0.01)


@functools.cache
def _slots(device_index: int) -> dict[int, int]:
    """Block slots of the whole GPU per compiled warp count (driver occupancy x SMs)."""
    device = torch.device("cuda", device_index)
    module = cuda_jit.load(SOURCE, device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return {w: sms * module.resident_blocks(f"paged_decode_fp8_w{w}", 32 * w, shared_bytes(w)) for w in WARPS}


def warps_for(programs: int, device: torch.device) -> int:
    """The warps of a launch of ``programs`` (sequence, KV head, split) blocks by
    choose_warps over this GPU's block slots (read once per device)."""
    device = torch.device(device)
    return choose_warps(programs, _slots(device.index if device.index is not None else torch.cuda.current_device()))


def decode_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
               tables: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, part_o: torch.Tensor,
               part_ml: torch.Tensor, splits: int, warps: int = 4, codes: torch.Tensor | None = None,
               code_scales: torch.Tensor | None = None) -> None:
    """One launch over q [B, H, D]: with one split the result goes to ``out`` [B, H, D]
    (BF16), or with ``codes`` [B, H * D] E4M3 and ``code_scales`` [B, H] (outer-dim-major,
    fp8_activation_buffers) to those, quantized as a block-FP8 linear quantizes that BF16
    output (each head one 1x128 group); with several, each split's partials (O / l, and
    (m, l) in natural-log units) go to ``part_o`` [B, H, splits, D] and ``part_ml``
    [B, H, splits, 2] for the Triton merge (paged_attention._merge_splits), which stores the
    output. ``cache_unsupported_reason`` must have said None."""
    if warps not in WARPS:
        raise ValueError(f"CUDA decode attention: warps must be one of {WARPS}, got {warps}")
    if codes is not None and splits != 1:
        raise ValueError("CUDA decode attention quantizes its output in one split only (the merge does for more)")
    b, h, _ = q.shape
    hkv = k.shape[2]
    module = cuda_jit.load(SOURCE, q.device)
    module.launch(f"paged_decode_fp8_w{warps}", (b, hkv, splits), (32 * warps, 1, 1),
                  q, q.stride(0), q.stride(1), k, v, k_scale, v_scale, tables, tables.stride(0), lengths,
                  out, out.stride(0), out.stride(1), part_o, part_ml, hkv, h // hkv, splits,
                  0 if codes is None else codes, 0 if code_scales is None else code_scales,
                  0 if codes is None else codes.stride(0), 0 if code_scales is None else code_scales.stride(-1),
                  shared_bytes=shared_bytes(warps))
