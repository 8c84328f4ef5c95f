"""The engine's reported logprobs held against a float32 full forward, beside the error a
BF16 full forward makes: shared by the GPU engine tests (every family, every format)."""

from __future__ import annotations

import torch


def mean_errors(results, bf16_model, f32_model, device) -> tuple[float, float]:
    """(mean |engine logprob - float32 forward's|, mean |BF16 forward's - float32 forward's|)
    over every response token of ``results``, each token scored by full forwards of its
    prompt and the response before it."""
    engine_err, forward_err = [], []
    for r in results:
        ids = torch.tensor([r.prompt_tokens + r.tokens[:-1]], device=device)
        tok = torch.tensor(r.tokens, device=device)[:, None]
        with torch.no_grad():
            lp = {name: torch.log_softmax(m(ids)[0, len(r.prompt_tokens) - 1:].double(), -1).gather(-1, tok)[:, 0].cpu()
                  for name, m in (("bf16", bf16_model), ("f32", f32_model))}
        engine_err.append((torch.tensor(r.logprobs, dtype=torch.float64) - lp["f32"]).abs())
        forward_err.append((lp["bf16"] - lp["f32"]).abs())
    return torch.cat(engine_err).mean().item(), torch.cat(forward_err).mean().item()
