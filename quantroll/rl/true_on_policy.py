"""``--true-on-policy-mode``: where it holds, where it is refused, and what it adds to a step.

With the mode on, the engine and the trainer both run the batch-invariant ops of
model/invariant.py, so the logprob the engine reports for a sampled token and the one the
trainer recomputes (old logprobs, and the first minibatch's forward) are the same bits:
the train/rollout gap is exactly 0.0, TIS / mask ratios are exactly 1, and the MoE routing
is the same on both sides (routing replay then replays what the trainer chooses anyway).

It holds when both sides compute the same function: BF16 on both sides, or mode 2 (the
trainer's forward in the engine's block FP8, exactly emulated on the CPU). It is refused,
with the reason, where the two sides differ on purpose or by construction.
"""

from __future__ import annotations

from quantroll.errors import QuantrollError
from quantroll.formats import get_format
from quantroll.model.invariant import TESTED_RECIPES  # the recipes the mode is proven for

FLAG = "--true-on-policy-mode"


def config_refusal(cfg) -> str | None:
    """Why the mode cannot hold for this TrainConfig (None: it can), before anything loads."""
    if cfg.engine.kv_cache_dtype != "bf16":
        return (f"{FLAG} cannot hold with --kv-cache-dtype {cfg.engine.kv_cache_dtype}: the engine would attend over E4M3 "
                "keys and values while the trainer attends in its own precision; use --kv-cache-dtype bf16")
    recipe = get_format(cfg.precision.train_recipe) if cfg.precision.train_recipe else None
    if recipe is not None and recipe.batch_dependent_activations:
        return (f"{FLAG} cannot hold with {' '.join(recipe.recipe_flag)}: {recipe.display_name} scales an activation "
                "by one amax over the whole tensor, so a token's quantization depends on the rest of its batch; use "
                "bf16 or --fp8-recipe blockwise")
    if recipe is not None and recipe.name not in TESTED_RECIPES:
        return (f"{FLAG} is built for BF16 and mode 2 (--rollout-precision fp8 --fp8-recipe blockwise); "
                f"{' '.join(recipe.recipe_flag)} is not tested in it yet")
    if cfg.models.rollout_precision not in (None, "bf16") and not cfg.precision.train_recipe:
        return mode1_refusal(f"--rollout-precision {cfg.models.rollout_precision}")
    return None


def mode1_refusal(what: str) -> str:
    return (f"{FLAG} cannot hold in mode 1 ({what} with a BF16 trainer): the engine and the trainer compute in "
            "different precisions on purpose; use mode 2 (--rollout-precision fp8 --fp8-recipe blockwise) or BF16")


def check_engine(engine, train_recipe: str | None) -> None:
    """After loading: a quantized --hf-checkpoint without a trainer recipe is mode 1."""
    if engine.format is not None and not train_recipe:
        raise QuantrollError(mode1_refusal(f"a {engine.format.name} --hf-checkpoint"))


def probe(engine, policy) -> None:
    """The machine checks of model/invariance_probe.py on the model's own GEMM shapes."""
    from quantroll.model.invariance_probe import check_invariance
    from quantroll.model.linear import QLinear

    shapes = [(m.out_features, m.in_features) for m in policy.modules() if isinstance(m, QLinear)]
    # the parts the engine fuses while the trainer runs them apart: their columns are probed too
    fused = [(m.out_features, m.in_features) for m in engine.model.modules()
             if isinstance(m, QLinear) and m.is_fused_part]
    device = next(policy.parameters()).device  # the engine may be a description on the meta device
    check_invariance(engine.kernels, engine.dtype, device, shapes, fused)


def notes(cfg, moe: bool) -> list[str]:
    """What the log says when the mode starts."""
    out = [f"{FLAG}: engine and trainer run batch-invariant kernels (model/invariant.py); the train/rollout gap "
           "must be exactly 0.0 at every step"]
    if moe and (cfg.correction.rollout_routing_replay or cfg.correction.routing_replay):
        out.append(f"{FLAG}: routing replay is a no-op here: the trainer chooses the same experts as the engine "
                   "(routing_agreement_layer* = 1.0)")
    if cfg.correction.enabled:
        out.append(f"{FLAG}: every TIS / mask ratio is exactly 1 (tis_ratio_min = tis_ratio_max = 1.0)")
    return out


def broken(record: dict) -> str | None:
    """Why the run must stop when a step's gap is not exactly 0.0 (None when it is): the mode
    never runs approximately; the step's metrics are written first."""
    gap = record["train_rollout_logprob_abs_diff"]
    if gap == 0.0:
        return None
    return (f"{FLAG} did not hold at step {record['step']}: train_rollout_logprob_abs_diff is {gap:.3e}, not 0.0 "
            "(the engine and the trainer computed different logprobs); the run is stopped with that step's metrics "
            "written: please report it with the command, or train without the flag")
