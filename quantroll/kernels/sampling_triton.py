"""Triton kernels of the fused sampling step (wrapper and contract: sampling.py).

For a row of logits [V] and untruncated sampling (top_p == 1, top_k == 0), one read
of the logits gives both the sampled token and its reported logprob:

    x[v]   = logits[v] / T                      (T = 1 when greedy)
    token  = argmax_v x[v] + gumbel(seed, position, v)      (greedy: argmax_v x[v])
    logp   = (x[token] - max x) - log(sum_v exp(x[v] - max x))

``sample_partials_kernel`` runs one program per (row, chunk of CHUNK vocabulary
entries) and writes the chunk's partials: max x, sum exp(x - that max), the best score,
its (global) index and x there. ``sample_combine_kernel`` runs one program per row and
folds the partials in chunk order with fixed-shape reductions, so the result depends
only on the row (never on the batch or on scheduling).

The noise is the engine's counter-based Gumbel noise (engine/sampling.py,
``gumbel_noise``) in uint32 arithmetic: the torch reference holds 32-bit values in int64
tensors and masks after each product, which keeps exactly the low 32 bits that uint32
wraparound keeps.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _lowbias32(x):
    """The lowbias32 mixer on uint32 values (engine/sampling.py ``_hash32``)."""
    x = x ^ (x >> 16)
    x = x * tl.full([], 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def sample_partials_kernel(logits_ptr, seeds_ptr, positions_ptr, part_ptr, idx_ptr,
                           V, stride_row, n_chunks, part_stride, temperature, inv_temperature,
                           GREEDY: tl.constexpr, RECIPROCAL: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    lane = tl.arange(0, CHUNK)
    offs = chunk * CHUNK + lane
    ok = offs < V
    z = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
    if GREEDY:
        x = z  # reported at T = 1
        score = x
    else:
        # x = logits / T rounded as torch rounds it: CUDA torch multiplies by the
        # float32 reciprocal of a scalar divisor, CPU torch divides
        if RECIPROCAL:
            x = z * inv_temperature
        else:
            x = tl.math.div_rn(z, temperature)
        seed = tl.load(seeds_ptr + row).to(tl.uint32)
        position = tl.load(positions_ptr + row).to(tl.uint32)
        key = _lowbias32(_lowbias32(seed) ^ position)
        bits = _lowbias32(key * tl.full([], 0x9E3779B1, tl.uint32) + offs.to(tl.uint32))
        u = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        u = tl.minimum(u, 1.0 - 1.0 / 16777216.0)  # (k + 0.5) rounds up to 2^24 for k = 2^24 - 1
        g = -tl.log(-tl.log(u))
        score = tl.where(ok, x + g, float("-inf"))
    m = tl.max(x, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)  # a chunk of -inf logits sums to 0, not nan
    s = tl.sum(tl.exp(x - shift), axis=0)
    best = tl.argmax(score, axis=0, tie_break_left=True)
    best_score = tl.max(score, axis=0)
    x_best = tl.max(tl.where(lane == best, x, float("-inf")), axis=0)
    p = part_ptr + row * n_chunks + chunk
    tl.store(p, m)
    tl.store(p + part_stride, s)
    tl.store(p + 2 * part_stride, best_score)
    tl.store(p + 3 * part_stride, x_best)
    tl.store(idx_ptr + row * n_chunks + chunk, chunk * CHUNK + best)


@triton.jit
def sample_combine_kernel(part_ptr, idx_ptr, tokens_ptr, logprobs_ptr, n_chunks, part_stride,
                          NC: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, NC)
    ok = c < n_chunks
    p = part_ptr + row * n_chunks + c
    m = tl.load(p, mask=ok, other=float("-inf"))
    s = tl.load(p + part_stride, mask=ok, other=0.0)
    best_score = tl.load(p + 2 * part_stride, mask=ok, other=float("-inf"))
    big = tl.max(m, axis=0)
    shift = tl.where(big == float("-inf"), 0.0, big)
    total = tl.sum(s * tl.exp(m - shift), axis=0)
    k = tl.argmax(best_score, axis=0, tie_break_left=True)  # earliest chunk: lowest index among ties
    token = tl.load(idx_ptr + row * n_chunks + k)
    x_best = tl.load(part_ptr + 3 * part_stride + row * n_chunks + k)
    tl.store(tokens_ptr + row, token.to(tl.int64))
    tl.store(logprobs_ptr + row, (x_best - big) - tl.log(total))
