"""The proposal checked through the real path, on seeds the proposal never saw.

Convert the BF16 checkpoint twice (everything quantized; the proposed flags), load each
conversion in the engine, sample fresh responses per verification seed, and score them
with the BF16 trainer: the step-0 gap a ``train`` run with those flags would report. The
reduction counts when it exceeds 2x the seed spread of the difference,
sqrt(std_full^2 + std_kept^2) (compare's convention for a difference of two groups). Both
engines sample the same prompts with the same seeds, so the per-seed differences are also
reported with their own std (the paired spread, smaller where the samples agree).
Also returns what the conversion with the flags really kept, for the round-trip check.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from quantroll.attribution.divergence import gap
from quantroll.attribution.flagset import FlagSet
from quantroll.attribution.sampling import draw_batch
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.compare.stats import stats
from quantroll.engine import Engine
from quantroll.trainer.policy import response_logprobs


def measured_gaps(source: Path, precision: str, flags: FlagSet, bf16_model, tokenizer, task, seeds, sample: dict,
                  device, dtype, workdir: Path) -> tuple[list[float], set[str]]:
    """(gap per seed of the engine on the conversion with ``flags``, modules that conversion kept)."""
    target = workdir / ("kept" if not flags.empty else "full")
    result = convert_checkpoint(source, target, ConvertConfig(format=precision, force=True, progress=False,
                                                              **flags.convert_fields()))
    engine = Engine(target, device=device, dtype=dtype)
    gaps = []
    for seed in seeds:
        b = draw_batch(engine, tokenizer, task, seed, **sample)
        with torch.no_grad():
            logp, mask = response_logprobs(bf16_model, b.prompts, b.responses, sample["temperature"])
        gaps.append(gap(logp, b.engine_logprobs, mask))
    return gaps, set(result.plan.kept())


def verify(source: Path, precision: str, flags: FlagSet, bf16_model, tokenizer, task, seeds, sample: dict, device,
           dtype) -> dict:
    with tempfile.TemporaryDirectory(prefix="quantroll-attribute-") as tmp:
        full, _ = measured_gaps(source, precision, FlagSet(), bf16_model, tokenizer, task, seeds, sample, device,
                                dtype, Path(tmp))
        kept, kept_modules = measured_gaps(source, precision, flags, bf16_model, tokenizer, task, seeds, sample,
                                           device, dtype, Path(tmp))
    s_full, s_kept = stats(full), stats(kept)
    reduction = s_full["mean"] - s_kept["mean"]
    spread = ((s_full["std"] or 0.0) ** 2 + (s_kept["std"] or 0.0) ** 2) ** 0.5 if len(seeds) > 1 else None
    return {"seeds": list(seeds), "full": s_full, "kept": s_kept, "full_per_seed": full, "kept_per_seed": kept,
            "reduction": reduction, "spread": spread,
            "paired_spread": stats([f - k for f, k in zip(full, kept)])["std"],
            "significant": None if spread is None else bool(reduction > 2 * spread),
            "kept_modules": sorted(kept_modules)}
