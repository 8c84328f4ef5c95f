"""Wrapper for the fused sampling kernels (sampling_triton.py).

``fused_sample`` is the decode step's sampler for untruncated sampling (top_p == 1,
top_k == 0, any temperature, greedy included). The torch reference
(engine/sampling.py, ``_sample_torch``) spends about thirty kernels over [B, V] per step: a float32 copy
and log_softmax of the logits, the Gumbel hash on int64 tensors, argmax and gather,
0.25-1 ms per step on an H200 at batch 16-64 and V = 151936. Here the logits (bf16 or
float32, read in place) are read once by B x ceil(V / CHUNK) programs that write a few
partials each, and a second, tiny kernel folds them per row. Both launches are CUDA
graph capturable: no host synchronization, outputs and partials from torch.empty.

Agreement with the reference:
- the Gumbel noise is ``gumbel_noise`` (same hash in uint32, same float32 steps).
  ``-log(-log(u))`` uses Triton's log: on an H200 (torch 2.11, Triton 3.6) it equalled
  torch's log on every one of the 2^24 values of u and the noise was bit for bit the
  same; elsewhere (other compilers, the CPU interpreter's numpy log) it may differ by
  an ulp;
- logits / T is rounded as torch rounds it on the same device (CUDA torch multiplies
  by the float32 reciprocal of a scalar divisor, CPU torch divides);
- the reported logprob is (x[tok] - max) - log(sum exp(x - max)) with the sum taken in
  another order than torch's: it agrees to float32 rounding (about 1e-6);
- the token is argmax(x + g) where torch takes argmax(log_softmax(x) + g), i.e. the
  same scores shifted by a per-row constant but rounded differently. The two can pick
  different tokens only when the two best scores are within a few float32 ulps of
  each other (for greedy: two logits that torch's log_softmax rounds to one value,
  where torch takes the lower index and this path the larger logit); with scores
  of order 10 that is a gap below about 1e-6, which random logits and noise produce
  with probability of order 1e-6 per row. Exact ties go to the lowest index, as in
  torch.argmax. NaN logits are not supported.
"""

from __future__ import annotations

import struct

import torch

# Vocabulary entries per program. Fixed, so that a row's result never depends on the
# batch. On an H200 (V = 151936, bf16) 1024-8192 entries and 2-16 warps all came within
# about 10% of each other; this choice: 5 / 13 / 40 us sampling, 4 / 6 / 13 us greedy at
# B = 1 / 16 / 64, against 112 / 277 / 976 and 48 / 61 / 135 us for the torch path.
CHUNK = 2048


def _f32(x: float) -> float:
    """x rounded to float32 (as a Python float)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def fused_sample(logits: torch.Tensor, temperature: float, seeds: torch.Tensor, positions: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [B], reported logprobs float32 [B]) for logits [B, V], untruncated.

    temperature 0 is greedy (argmax of the logits, logprob at T = 1); otherwise the
    token is the Gumbel-max sample with the noise of (seeds[b], positions[b], token id)."""
    from quantroll.kernels.sampling_triton import sample_combine_kernel, sample_partials_kernel

    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    b, v = logits.shape
    n_chunks = (v + CHUNK - 1) // CHUNK
    greedy = temperature == 0
    t = _f32(1.0 if greedy else float(temperature))
    inv_t = _f32(1.0 / t)  # float32 1/T: float64 division rounded once more to float32 is exact here
    dev = logits.device
    parts = torch.empty(4, b, n_chunks, dtype=torch.float32, device=dev)  # max, sum exp, best score, x at best
    idx = torch.empty(b, n_chunks, dtype=torch.int32, device=dev)
    tokens = torch.empty(b, dtype=torch.int64, device=dev)
    logprobs = torch.empty(b, dtype=torch.float32, device=dev)
    if b == 0:
        return tokens, logprobs
    part_stride = b * n_chunks
    sample_partials_kernel[(b, n_chunks)](
        logits, seeds, positions, parts, idx, v, logits.stride(0), n_chunks, part_stride, t, inv_t,
        GREEDY=greedy, RECIPROCAL=logits.is_cuda, CHUNK=CHUNK, num_warps=2 if greedy else 4)
    nc = 1 << max(n_chunks - 1, 0).bit_length()
    sample_combine_kernel[(b,)](parts, idx, tokens, logprobs, n_chunks, part_stride, NC=max(nc, 2), num_warps=1)
    return tokens, logprobs
