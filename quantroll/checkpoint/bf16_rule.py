"""Which modules stay in BF16 by their name alone, whatever the format and the user's flags.

The one statement of the rule. ``convert``'s plan (plan.py) starts from it and adds what
depends on shapes and flags (partial blocks, --skip, first / last layers, fused siblings,
name collisions); the model builder asks it through ``unless_kept`` before it gives a
linear a format, so a model built with "this format everywhere" (benches, random models)
quantizes what a converted checkpoint quantizes. Everything downstream of a checkpoint (the
engine, the weight sync, the trainer's quantized forward, the weight broadcast) reads the
set of quantized modules off the converted checkpoint (``Engine.quantized_layers``), so it
agrees by construction. tests/checkpoint/test_bf16_rule.py holds the rule to a table of
module names of every family and the three sides to one random MoE checkpoint.

Kept, with the reason plan.py records:
  embedding   ``embed_tokens`` (any ``*embed*``; GPT-2's ``wte``, ``wpe``): a table lookup,
              not a linear layer
  lm_head     the output head: numerically sensitive (every logit), and tied to the
              embedding in small models
  norm        ``*norm*``, ``ln_*``: normalization weights (vectors)
  router      MoE gates (``mlp.gate``, a shared expert's ``shared_expert_gate``, ``router``):
              tiny, and a flipped top-k choice costs more than any speedup. Not
              ``gate_proj``, the MLP's gate projection, which quantizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

EMBEDDING, LM_HEAD, NORM, ROUTER = "embedding", "lm_head", "norm", "router"

_Format = TypeVar("_Format")


def kept_by_name(module: str) -> str:
    """The reason ``module`` (a module name, e.g. ``model.layers.0.mlp.gate``) stays BF16
    by its name alone (EMBEDDING, LM_HEAD, NORM or ROUTER), or "" where its format is for
    the shapes and the user's flags to decide."""
    last = module.rpartition(".")[2]
    if last == "lm_head":
        return LM_HEAD
    if "embed" in last or last in ("wte", "wpe"):
        return EMBEDDING
    if "norm" in last or last.startswith("ln_") or last == "ln":
        return NORM
    if last in ("gate", "router") or last.endswith("expert_gate"):
        return ROUTER
    return ""


def unless_kept(fmt_for: Callable[[str], _Format | None]) -> Callable[[str], _Format | None]:
    """``fmt_for`` (module name -> format or None, what the model builder asks of each
    linear) with the modules this rule keeps answered None."""
    def choose(module: str) -> _Format | None:
        return None if kept_by_name(module) else fmt_for(module)
    return choose
