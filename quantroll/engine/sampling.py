"""Sampling and the logprob the engine reports, as pure tensor functions.

The reported logprob of a token is ``log_softmax(logits / T)`` over the full
vocabulary, taken before top-p / top-k truncation (docs/ARCHITECTURE.md): truncation changes
what is sampled, never the number the trainer compares against. With T = 0
(greedy) the reported logprob is taken at T = 1.

Randomness is counter-based: the Gumbel noise of (sequence seed, position, token id)
is a hash of those three integers, so a seed reproduces a sample whatever else shares
the batch, on CPU and GPU alike, with no generator state and no host round trip.

On CUDA, untruncated sampling (top_p == 1, top_k == 0 or >= V; any temperature,
greedy included) takes the fused Triton path (kernels/sampling.py): one read of the
logits and two launches instead of the ~30 torch kernels over [B, V] below (a float32
copy, log_softmax, the hash on int64 tensors, argmax, gather), which cost 0.25-1 ms per
decode step at batch 16-64 on an H200. It draws the same noise and reports the same
logprob to float32 rounding; the token can differ from this torch path only where the
two best scores are within float32 rounding of each other (kernels/sampling.py says
how rare). The torch path stays the reference, and the path for top-p / top-k
truncation and for CPU tensors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from quantroll.errors import QuantrollError
from quantroll.kernels.quantize import triton_available
from quantroll.model import invariant
from quantroll.model.kernel_config import DEFAULT_KERNELS, KernelConfig

_MASK32 = 0xFFFFFFFF


# Below this (and above 0) logits / T overflows float32 for large logits, and the sample
# is the greedy one anyway: such temperatures are refused (use 0 for greedy).
MIN_TEMPERATURE = 1e-6
SEED_LIMIT = 2**32  # seeds are hashed as 32-bit integers (seed + prompt index wraps)


def check_sampling_seed(seed: int, flag: str = "--seed") -> None:
    """A command's sampling seed, checked where the user gave it, before any work
    (SamplingParams says the same later, without the flag's name)."""
    if not 0 <= seed < SEED_LIMIT:
        raise QuantrollError(f"{flag} must be in [0, 2^32) (the engine hashes 32-bit sampling seeds), got {seed!r}")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] | None = None  # None: the checkpoint's EOS ids
    seed: int = 0

    def __post_init__(self):
        t = self.temperature
        if not isinstance(t, numbers.Real) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise QuantrollError(f"temperature must be a finite number >= 0 (0: greedy), got {t!r}")
        if 0 < t < MIN_TEMPERATURE:
            raise QuantrollError(f"temperature {t!r} is below {MIN_TEMPERATURE:g}, where logits / T overflow float32 "
                                 "and sampling is greedy anyway; use temperature=0 for greedy")
        if not isinstance(self.top_p, numbers.Real) or not 0 < self.top_p <= 1:
            raise QuantrollError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise QuantrollError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise QuantrollError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not _is_int(self.seed):
            raise QuantrollError(f"seed must be an integer in [0, 2^32), got {self.seed!r}")
        check_sampling_seed(self.seed, "seed")
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable) or not all(_is_int(i) for i in ids):
                raise QuantrollError(f"stop_token_ids must be integers (or None for the checkpoint's EOS ids), "
                                     f"got {ids!r}")
            object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (lowbias32) on int64 tensors holding 32-bit values."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, V] determined by (seed[b], position[b], token id)."""
    row = _hash32(_hash32(seeds.to(torch.int64)) ^ positions.to(torch.int64))
    ids = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = _hash32(row[:, None] * 0x9E3779B1 + ids[None, :])
    u = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    # k + 0.5 is not a float32 for k >= 2^23 and rounds to even: k = 2^24 - 1 gives u = 1
    # and infinite noise (about 1 row in 100 at V = 151936, a uniformly drawn token).
    # Capped below 1, u is in (0, 1) and every other draw is unchanged.
    u = torch.clamp(u, max=1.0 - 1.0 / (1 << 24))
    return -torch.log(-torch.log(u))


def reported_logprobs(logits: torch.Tensor, temperature: float, kernels: KernelConfig = DEFAULT_KERNELS
                      ) -> torch.Tensor:
    """log_softmax(logits / T) over the full vocabulary, float32 (T = 0 -> T = 1); with
    batch-invariant kernels the tree-sum form the trainer computes too."""
    t = temperature if temperature > 0 else 1.0
    if kernels.batch_invariant:
        return invariant.log_softmax(logits.to(torch.float32) / t)
    return torch.log_softmax(logits.to(torch.float32) / t, dim=-1)


def truncation_mask(logprobs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """True for tokens that top-k / top-p keep (the most likely token is always kept)."""
    keep = torch.ones_like(logprobs, dtype=torch.bool)
    if top_k and top_k < logprobs.shape[-1]:
        kth = torch.topk(logprobs, top_k, dim=-1).values[..., -1:]
        keep &= logprobs >= kth
    if top_p < 1.0:
        sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
        probs = sorted_lp.exp()
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
        keep_sorted = before < top_p
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    return keep


def _fused_applies(logits: torch.Tensor, params: SamplingParams) -> bool:
    """The fused kernel covers CUDA logits [B, V] without truncation, when triton imports."""
    untruncated = params.top_p == 1.0 and (params.top_k == 0 or params.top_k >= logits.shape[-1])
    return logits.is_cuda and logits.dim() == 2 and untruncated and triton_available()


def sample(logits: torch.Tensor, params: SamplingParams, seeds: torch.Tensor, positions: torch.Tensor,
           kernels: KernelConfig = DEFAULT_KERNELS) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [B], their reported logprobs [B]) for logits [B, V].

    CUDA logits without truncation go through a fused kernel (one read of the logits
    instead of ~30 kernels; see the module docstring; with batch-invariant kernels the
    invariant log-softmax's own pass, kernels/invariant_rows.sample), everything else
    through the torch reference ``_sample_torch``. Either way the reported logprob is read
    from the logprobs the token was drawn from."""
    if _fused_applies(logits, params):
        if kernels.batch_invariant:
            # one pass forms the log-softmax the trainer recomputes (the same kernel, bit for bit)
            # and draws from it, instead of ~15 torch ops over [B, V] int64 noise
            from quantroll.kernels import invariant_rows

            t = params.temperature if params.temperature > 0 else 1.0
            return invariant_rows.sample(logits.to(torch.float32) / t, params.greedy, seeds, positions)
        from quantroll.kernels.sampling import fused_sample

        return fused_sample(logits, params.temperature, seeds, positions)
    return _sample_torch(logits, params, seeds, positions, kernels)


def _sample_torch(logits: torch.Tensor, params: SamplingParams, seeds: torch.Tensor, positions: torch.Tensor,
                  kernels: KernelConfig = DEFAULT_KERNELS) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: (token ids [B], their reported logprobs [B]) in plain torch ops."""
    logprobs = reported_logprobs(logits, params.temperature, kernels)
    if params.greedy:
        tokens = torch.argmax(logprobs, dim=-1)
    else:
        keep = truncation_mask(logprobs, params.top_p, params.top_k)
        scores = logprobs + gumbel_noise(seeds, positions, logits.shape[-1])
        tokens = torch.argmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]
