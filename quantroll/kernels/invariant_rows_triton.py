"""Row-wise batch-invariant kernels of ``--true-on-policy-mode`` on a GPU, in Triton.

One program reduces one row, over a block whose size depends on the row's length alone,
so a row's value cannot depend on how many rows share the launch or where it sits: the
engine's decode step (a few rows), its prefill and the trainer's forward (thousands of
rows) give it the same bits. They replace the tree-sum torch forms (model/invariant.py),
whose ~30 launches per norm were most of a decode step's kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantroll.kernels.sampling_triton import _lowbias32


@triton.jit
def rms_norm_rows_kernel(x_ptr, w_ptr, y_ptr, H, s_xm, s_ym, h_float, eps, BLOCK: tl.constexpr):
    """y = w * round(x / sqrt(mean(x^2) + eps)) for one row; the mean a float32 tree over
    BLOCK lanes (padding adds exact zeros), the division and square root correctly rounded;
    the product rounded once to y's dtype, as torch's ``weight * h.to(dtype)`` does."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    x = tl.load(x_ptr + row * s_xm + cols, mask=ok, other=0.0).to(tl.float32)
    mean_sq = tl.math.div_rn(tl.sum(x * x, axis=0), h_float)
    h = tl.math.div_rn(x, tl.math.sqrt_rn(mean_sq + eps)).to(y_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    y = w.to(tl.float32) * h.to(tl.float32)
    tl.store(y_ptr + row * s_ym + cols, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def norm_rope_rows_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, HEADS, s_xr, s_xh, s_cr, s_yr, s_yh, h_float, eps,
                          HALF: tl.constexpr):
    """One head of one token: RMSNorm over its D = 2 HALF values (the mean of squares two
    fixed float32 trees, one a half, then their sum), then rotary with that token's
    cos / sin: y = n * cos + rotate_half(n) * sin, each product and the sum rounded to y's
    dtype as the torch form (model/rope.apply_rotary) rounds them."""
    pid = tl.program_id(0).to(tl.int64)
    token = pid // HEADS
    head = pid % HEADS
    offs = tl.arange(0, HALF)
    xr = x_ptr + token * s_xr + head * s_xh
    x1 = tl.load(xr + offs).to(tl.float32)
    x2 = tl.load(xr + HALF + offs).to(tl.float32)
    mean_sq = tl.math.div_rn(tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0), h_float)
    root = tl.math.sqrt_rn(mean_sq + eps)
    dtype = y_ptr.dtype.element_ty
    n1 = (tl.load(w_ptr + offs).to(tl.float32) * tl.math.div_rn(x1, root).to(dtype).to(tl.float32)).to(dtype)
    n2 = (tl.load(w_ptr + HALF + offs).to(tl.float32) * tl.math.div_rn(x2, root).to(dtype).to(tl.float32)).to(dtype)
    c1 = tl.load(cos_ptr + token * s_cr + offs).to(tl.float32)
    c2 = tl.load(cos_ptr + token * s_cr + HALF + offs).to(tl.float32)
    s1 = tl.load(sin_ptr + token * s_cr + offs).to(tl.float32)
    s2 = tl.load(sin_ptr + token * s_cr + HALF + offs).to(tl.float32)
    a1 = (n1.to(tl.float32) * c1).to(dtype).to(tl.float32)
    b1 = (-n2.to(tl.float32) * s1).to(dtype).to(tl.float32)
    a2 = (n2.to(tl.float32) * c2).to(dtype).to(tl.float32)
    b2 = (n1.to(tl.float32) * s2).to(dtype).to(tl.float32)
    yr = y_ptr + token * s_yr + head * s_yh
    tl.store(yr + offs, (a1 + b1).to(dtype))
    tl.store(yr + HALF + offs, (a2 + b2).to(dtype))


@triton.jit
def silu_mul_rows_kernel(g_ptr, u_ptr, y_ptr, I, s_gr, s_ur, s_yr, BLOCK: tl.constexpr):
    """y = round(round(g / (1 + exp(-g))) * u) for a BLOCK of one row's I entries: silu in
    float32 rounded once to y's dtype, then the product rounded, as the torch form
    (model/invariant.silu(gate) * up) rounds it. Elementwise: nothing depends on the launch."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    g = tl.load(g_ptr + row * s_gr + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * s_ur + cols, mask=ok, other=0.0).to(tl.float32)
    dtype = y_ptr.dtype.element_ty
    silu = tl.math.div_rn(g, 1.0 + tl.exp(-g)).to(dtype).to(tl.float32)
    tl.store(y_ptr + row * s_yr + cols, (silu * u).to(dtype), mask=ok)


@triton.jit
def _gumbel(seed, position, ids):
    """The engine's counter-based Gumbel(0, 1) noise of (seed, position, token id)
    (engine/sampling.gumbel_noise; the same uint32 hash as kernels/sampling_triton.py)."""
    key = _lowbias32(_lowbias32(seed) ^ position)
    bits = _lowbias32(key * tl.full([], 0x9E3779B1, tl.uint32) + ids.to(tl.uint32))
    u = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    u = tl.minimum(u, 1.0 - 1.0 / 16777216.0)
    return -tl.log(-tl.log(u))


@triton.jit
def log_softmax_rows_kernel(x_ptr, y_ptr, seeds_ptr, positions_ptr, tokens_ptr, token_lp_ptr, V, s_xm, s_ym,
                            BLOCK: tl.constexpr, STORE: tl.constexpr, SAMPLE: tl.constexpr, GREEDY: tl.constexpr):
    """For one float32 row x of V entries, lp = z - log(sum(exp(z))) with z = x - max(x):
    the max over BLOCK lanes, the sum of exponentials accumulated lane by lane in vocabulary
    order and reduced once by a fixed tree (exp(-inf) adds exact zeros at the tail).

    STORE: write lp to y (the trainer's logprobs, the engine's truncated sampling).
    SAMPLE: the engine's untruncated sampling in the same pass that forms lp: the token is
    argmax(lp + Gumbel noise) (GREEDY: argmax lp), ties to the lowest id, and its reported
    logprob is that lane's lp, the very value STORE writes, so the trainer's recomputation
    through STORE gives the same bits."""
    row = tl.program_id(0).to(tl.int64)
    xr = x_ptr + row * s_xm
    cols = tl.arange(0, BLOCK)
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for v0 in range(0, V, BLOCK):
        x = tl.load(xr + v0 + cols, mask=v0 + cols < V, other=float("-inf"))
        lane_max = tl.maximum(lane_max, x)
    m = tl.max(lane_max, axis=0)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, V, BLOCK):
        x = tl.load(xr + v0 + cols, mask=v0 + cols < V, other=float("-inf"))
        lane_sum += tl.exp(x - m)
    log_total = tl.log(tl.sum(lane_sum, axis=0))
    if SAMPLE and not GREEDY:
        seed = tl.load(seeds_ptr + row).to(tl.uint32)
        position = tl.load(positions_ptr + row).to(tl.uint32)
    best_score = float("-inf")
    best_id = 0
    best_lp = float("-inf")
    for v0 in range(0, V, BLOCK):
        ok = v0 + cols < V
        x = tl.load(xr + v0 + cols, mask=ok, other=0.0)
        lp = (x - m) - log_total
        if STORE:
            tl.store(y_ptr + row * s_ym + v0 + cols, lp, mask=ok)
        if SAMPLE:
            if GREEDY:
                score = tl.where(ok, lp, float("-inf"))
            else:
                score = tl.where(ok, lp + _gumbel(seed, position, v0 + cols), float("-inf"))
            chunk_best = tl.max(score, axis=0)
            lane = tl.argmax(score, axis=0, tie_break_left=True)
            # strictly: an earlier chunk keeps a tie; the first chunk is always taken, so a row of
            # NaN scores reports its token's lp (NaN), as the trainer's STORE pass computes it
            take = (chunk_best > best_score) | (v0 == 0)
            # the lane's lp exactly (x + -0.0 == x; a NaN stays NaN, which max() would drop)
            best_lp = tl.where(take, tl.sum(tl.where(cols == lane, lp, -0.0), axis=0), best_lp)
            best_id = tl.where(take, v0 + lane, best_id)
            best_score = tl.where(take, chunk_best, best_score)
    if SAMPLE:
        tl.store(tokens_ptr + row, best_id.to(tl.int64))
        tl.store(token_lp_ptr + row, best_lp)
