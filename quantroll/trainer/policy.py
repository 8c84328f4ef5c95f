"""The trainer's policy: BF16 weights loaded from ``--ref-load``, and its logprobs.

The trainer never trains on quantized weights: a checkpoint with a quantization_config
is refused with the reason (in Miles, the FSDP trainer loads ``--hf-checkpoint`` too, so
an FP8 rollout checkpoint silently becomes an FP8 trainer; mode 1 needs BF16 here).
Logprobs are computed exactly as the engine reports them: full-vocabulary
``log_softmax(logits / T)`` at the response tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.utils.checkpoint

from quantroll.errors import QuantrollError
from quantroll.inputs import read_json
from quantroll.model import invariant
from quantroll.model.causal_lm import CausalLM
from quantroll.model.kernel_config import DEFAULT_KERNELS, ForwardPlan, KernelConfig, TrainFormat
from quantroll.model.loader import load_model
from quantroll.model.moe import Routing


def refuse_quantized(checkpoint_dir: str | Path, flag: str = "--ref-load") -> None:
    cfg_path = Path(checkpoint_dir) / "config.json"
    if not cfg_path.is_file():
        raise QuantrollError(f"{flag} {checkpoint_dir}: config.json not found; point it at a BF16 HF checkpoint")
    qc = read_json(cfg_path, f"{flag}'s config", fix="fix or re-download it").get("quantization_config")
    if isinstance(qc, dict):
        method = qc.get("quant_algo") or qc.get("quant_method")
        raise QuantrollError(
            f"{flag} {checkpoint_dir} is a quantized ({method}) checkpoint; the trainer needs BF16 weights. "
            "For mode 1 give the engine the quantized checkpoint with --hf-checkpoint and the trainer the BF16 "
            "one it was converted from with --ref-load")


def load_policy(checkpoint_dir: str | Path, device="cpu", dtype=torch.bfloat16,
                kernels: KernelConfig = DEFAULT_KERNELS, train: TrainFormat | None = None) -> CausalLM:
    """The trainable policy, its forward plan decided here once (model/kernel_config.py):
    ``kernels``: the forward's op forms (batch-invariant ones for true on-policy, where the
    backward still takes the ordinary kernels); ``train``: the unified low precision of modes
    2-4 (None: BF16). The trainer never fuses projections nor stacks experts."""
    refuse_quantized(checkpoint_dir)
    model, _ = load_model(checkpoint_dir, device, dtype)
    model.prepare_(ForwardPlan(kernels=kernels, train=train))
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def pad_batch(prompts: list[list[int]], responses: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids [B, L] right-padded, response targets [B, R], response mask [B, R]) where the
    model input is prompt + response[:-1] and row b predicts its response at P_b - 1 ...."""
    b = len(prompts)
    r_max = max(len(r) for r in responses)
    l_max = max(len(p) + len(r) - 1 for p, r in zip(prompts, responses))
    ids = torch.zeros(b, l_max, dtype=torch.long)
    targets = torch.zeros(b, r_max, dtype=torch.long)
    mask = torch.zeros(b, r_max)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        seq = p + r[:-1]
        ids[i, : len(seq)] = torch.tensor(seq)
        targets[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids.to(device), targets.to(device), mask.to(device)


# Response positions whose logits one pass materializes: [rows, vocab] float32 (2048 x 151936
# x 4 bytes = 1.2 GiB for Qwen3). Never the logits of whole sequences: a 16K-token response
# batch would need ~100 GiB.
LOGPROB_CHUNK_ROWS = 2048


def _log_softmax(model: CausalLM, hidden: torch.Tensor, t: float) -> torch.Tensor:
    logits = model.logits(hidden).float()
    if model.kernels.batch_invariant:  # the engine's reported logprob (engine/sampling.py), same bits
        return invariant.log_softmax(logits / t)
    return torch.log_softmax(logits / t, dim=-1)


def _token_logprobs(model: CausalLM, hidden: torch.Tensor, targets: torch.Tensor, t: float) -> torch.Tensor:
    return _log_softmax(model, hidden, t).gather(-1, targets[:, None])[:, 0]


def _token_logprobs_and_entropy(model: CausalLM, hidden: torch.Tensor, targets: torch.Tensor, t: float
                                ) -> torch.Tensor:
    """[rows, 2]: the target's logprob and the distribution's entropy -sum p log p (nats)."""
    logp = _log_softmax(model, hidden, t)
    p = logp.exp()  # without autograd in place: no more [rows, vocab] buffers than the log_softmax took
    plogp = p * logp if torch.is_grad_enabled() else p.mul_(logp)
    return torch.stack([logp.gather(-1, targets[:, None])[:, 0], -plogp.sum(-1)], dim=-1)


def _per_response_token(model: CausalLM, prompts: list[list[int]], responses: list[list[int]], temperature: float,
                        routing: Routing | None, chunk_rows: int, per_row, width: int):
    """(values [B, R, width] of ``per_row`` at each response token, mask [B, R]): the forward
    once, then the vocabulary projection ``chunk_rows`` positions at a time."""
    device = next(model.parameters()).device
    ids, targets, mask = pad_batch(prompts, responses, device)
    hidden = model.hidden(ids, routing=routing)
    t = temperature if temperature > 0 else 1.0
    rows = [i for i, r in enumerate(responses) for _ in r]  # one entry per response token
    steps = [j for r in responses for j in range(len(r))]
    cols = [len(prompts[i]) - 1 + j for i, j in zip(rows, steps)]  # the position that predicts it
    rows, steps, cols = (torch.tensor(x, dtype=torch.long, device=device) for x in (rows, steps, cols))
    picked, wanted = hidden[rows, cols], targets[rows, steps]
    parts = []
    for start in range(0, len(rows), chunk_rows):
        h, y = picked[start: start + chunk_rows], wanted[start: start + chunk_rows]
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(torch.utils.checkpoint.checkpoint(per_row, model, h, y, t, use_reentrant=False))
        else:
            parts.append(per_row(model, h, y, t))
    out = torch.zeros(*mask.shape, width, dtype=torch.float32, device=device)
    if parts:
        out = out.index_put((rows, steps), torch.cat(parts).view(-1, width))
    return out, mask


def response_logprobs(model: CausalLM, prompts: list[list[int]], responses: list[list[int]],
                      temperature: float, routing: Routing | None = None,
                      chunk_rows: int = LOGPROB_CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp [B, R] float32 of each response token, mask [B, R]); differentiable.

    The vocabulary projection runs only at the positions that predict a response token,
    ``chunk_rows`` of them at a time; under autograd each chunk is recomputed in the
    backward pass (activation checkpointing), so no chunk's logits outlive it."""
    out, mask = _per_response_token(model, prompts, responses, temperature, routing, chunk_rows, _token_logprobs, 1)
    return out[..., 0], mask


def response_logprobs_and_entropy(model: CausalLM, prompts: list[list[int]], responses: list[list[int]],
                                  temperature: float, routing: Routing | None = None,
                                  chunk_rows: int = LOGPROB_CHUNK_ROWS
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp [B, R], entropy [B, R] of the policy's distribution at each response position
    (nats, at the sampling temperature), mask [B, R]): the old-logprob pass's by-product, so
    that a run reports how much choice its policy has where it is measured (the
    train/rollout gap grows with it)."""
    out, mask = _per_response_token(model, prompts, responses, temperature, routing, chunk_rows,
                                    _token_logprobs_and_entropy, 2)
    return out[..., 0], out[..., 1], mask
