"""The whole FP8 MLP of a decode step in one persistent launch (experimental, off by
default: see mlp_decode.py).

Per layer the decode step runs gate_up GEMM -> silu*up (+ FP8 quantization) -> down GEMM
as three launches; each pays launch, ramp-up and drain while the memory system idles
(~5 us each on the H200 against 24 + 12 us of weight bytes at batch 16). Here one grid
of programs that are all resident at once walks the three phases, separated by grid
barriers (an arrival counter), so that the weight stream only pauses for the barriers.

The arithmetic is that of the three kernels it replaces, op for op: the gate and up rows
through ``decode_gemm_acc`` (the decode GEMM's own tile loop) rounded to BF16, silu*up as
``silu_mul_kernel`` computes it, the quantization by ``_store_fp8_groups``, the down GEMM
through ``decode_gemm_tile`` with its split-K partials and counters.

PHASE 0 runs everything with barriers (the GPU); PHASE 1, 2, 3 run one phase each, as
three launches with no barrier (Triton's interpreter, which runs programs one after
another and would wait forever at a barrier; also a fallback for debugging).
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantroll.kernels.fp8_gemm_triton import decode_gemm_acc, decode_gemm_tile
from quantroll.kernels.fused_triton import _store_fp8_groups


@triton.jit
def grid_barrier(bar_ptr, target, MAX_SPINS: tl.constexpr):
    """Wait until the arrival counter at bar_ptr reaches ``target`` (this program's arrival
    counted). Every program of the grid must be resident at once; if the counter has not
    got there after MAX_SPINS polls (~1 s on the GPU), the program stops waiting and sets
    the timeout flag at bar_ptr + 2, which the host turns into an error
    (mlp_decode.raise_on_barrier_timeout): wrong outputs are reported, never a hang. Once
    the flag is set, later barriers do not wait at all until the host has cleared it."""
    tl.debug_barrier()  # this program's writes are issued before it arrives
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    # a barrier that already gave up (this launch or an earlier one not yet checked by the
    # host): do not wait again, so a persistent failure costs one timeout, not one per barrier
    spins = tl.where(tl.atomic_add(bar_ptr + 2, 0, sem="acquire", scope="gpu") != 0, MAX_SPINS, 0)
    while (seen < target) & (spins < MAX_SPINS):
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.atomic_xchg(bar_ptr + 2, 1)
    tl.debug_barrier()


@triton.jit
def mlp_decode_kernel(a_ptr, as_ptr, wgu_ptr, wgus_ptr, wd_ptr, wds_ptr, h_ptr, hq_ptr, hs_ptr, part_ptr, y_ptr,
                      lock_ptr, bar_ptr, M, H, I,
                      s_am, s_asm, s_ask, s_wgn, s_wgsn, s_wgsk, s_wdn, s_wdsn, s_wdsk, s_h, s_hq, s_hsm, s_hsg, s_y,
                      BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      KB_UP: tl.constexpr, SPLIT: tl.constexpr, KB_DOWN: tl.constexpr, QBLOCK: tl.constexpr,
                      PHASE: tl.constexpr, MAX_SPINS: tl.constexpr = 1 << 20, IMPRECISE_ACC: tl.constexpr = 32):
    """a [M, H] FP8 codes with 1x128 scales; gate_up weight [2I, H] (gate rows, then up
    rows) and down weight [H, I], FP8 with 128x128 scales -> y [M, H] BF16. Scratch:
    h [M, I] BF16, its FP8 codes hq and scales hs, split-K partials, counters; bar_ptr
    holds [arrivals, programs done, barrier timeout flag]."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    if PHASE == 0 or PHASE == 1:  # h = silu(gate) * up, BLOCK_G intermediate columns per item
        for j in range(pid, tl.cdiv(I, BLOCK_G), grid):
            offs_g = j * BLOCK_G + tl.arange(0, BLOCK_G)
            g_ok = offs_g < I
            gate = decode_gemm_acc(a_ptr, as_ptr, wgu_ptr, wgus_ptr, offs_m, m_ok, offs_g, g_ok, 0, H,
                                   s_am, 1, s_asm, s_ask, s_wgn, 1, s_wgsn, s_wgsk,
                                   BLOCK_M, BLOCK_G, BLOCK_K, KB_UP, False, IMPRECISE_ACC)
            up = decode_gemm_acc(a_ptr, as_ptr, wgu_ptr, wgus_ptr, offs_m, m_ok, offs_g + I, g_ok, 0, H,
                                 s_am, 1, s_asm, s_ask, s_wgn, 1, s_wgsn, s_wgsk,
                                 BLOCK_M, BLOCK_G, BLOCK_K, KB_UP, False, IMPRECISE_ACC)
            g = gate.to(h_ptr.dtype.element_ty).to(tl.float32)  # the GEMM's BF16 output, as silu_mul reads it
            u = up.to(h_ptr.dtype.element_ty)
            act = (g / (1.0 + tl.exp(-g))).to(u.dtype)
            h = (act.to(tl.float32) * u.to(tl.float32)).to(u.dtype)  # [BLOCK_G, BLOCK_M]: columns of h^T
            tl.store(h_ptr + offs_m[None, :] * s_h + offs_g[:, None], h, mask=g_ok[:, None] & m_ok[None, :])
    if PHASE == 0:
        grid_barrier(bar_ptr, grid, MAX_SPINS)
    if PHASE == 0 or PHASE == 2:  # FP8 codes and 1x128 scales of h, QBLOCK columns of a row per item
        n_qb = tl.cdiv(I, QBLOCK)
        for q in range(pid, M * n_qb, grid):
            row = q // n_qb
            blk = q % n_qb
            offs = blk * QBLOCK + tl.arange(0, QBLOCK)
            ok = offs < I
            hv = tl.load(h_ptr + row * s_h + offs, mask=ok, other=0.0, cache_modifier=".cg")  # other SMs wrote it
            _store_fp8_groups(hv, ok, hq_ptr + row * s_hq, hs_ptr + row * s_hsm, s_hsg, blk * (QBLOCK // 128), I // 128,
                              QBLOCK)
    if PHASE == 0:
        grid_barrier(bar_ptr, 2 * grid, MAX_SPINS)
    if PHASE == 0 or PHASE == 3:  # y = down(hq): output tiles of BLOCK_N rows x SPLIT K splits
        n_tiles = tl.cdiv(H, BLOCK_N)
        for it in range(pid, n_tiles * SPLIT, grid):
            tile = it % n_tiles
            decode_gemm_tile(hq_ptr, hs_ptr, wd_ptr, wds_ptr, part_ptr, y_ptr, lock_ptr, M, H, I, tile, 0, it // n_tiles,
                             tile, s_hq, 1, s_hsm, s_hsg, s_wdn, 1, s_wdsn, s_wdsk, s_y, 1,
                             BLOCK_M, BLOCK_N, BLOCK_K, KB_DOWN, SPLIT, False, IMPRECISE_ACC)
    if PHASE == 0:  # the last program out resets the barrier for the next call (every program left its waits)
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == grid - 1:
            tl.atomic_xchg(bar_ptr, 0)
            tl.atomic_xchg(bar_ptr + 1, 0)
