"""The checks of ``quantroll train``'s configuration (rl/config.py): one flag's value, a
task's settings given to another task, and what spans the stages. One line naming the flag,
before any work."""

from __future__ import annotations

import math

from quantroll.errors import QuantrollError

SEED_LIMIT = 2**64
FLOAT32_MAX = 3.4028234663852886e38


def bad(flag: str, what: str, value) -> QuantrollError:
    return QuantrollError(f"--{flag} must be {what}, got {value!r}")


def at_least(**values: tuple[int, int]) -> None:
    """Each ``flag_name=(value, least)``: one line naming the flag when value < least."""
    for name, (value, least) in values.items():
        if value < least:
            raise bad(name.replace("_", "-"), f">= {least}", value)


def positive(**values) -> None:
    for name, value in values.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            raise bad(name.replace("_", "-"), "a finite number > 0", value)


def non_negative(**values) -> None:
    for name, value in values.items():
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise bad(name.replace("_", "-"), "a finite number >= 0", value)


# a built-in task's own settings: field -> the task it belongs to
_TASK_OF = {"digits": "arithmetic", "count_span": "count", "trace_len": "fib", "trace_terms": "fib",
            "trace_partial_credit": "fib"}


def refuse_other_task_flags(rollout, defaults: dict) -> None:
    """A setting of a task the run does not train on ('--trace-len 64' with arithmetic, or
    any with --prompt-data) was ignored silently; a value other than its default is refused.
    (One equal to the default cannot be told from no flag, and changes nothing.)"""
    if rollout.prompt_data and rollout.task != defaults["task"]:
        raise QuantrollError(f"--task {rollout.task} and --prompt-data both given; the prompts come from "
                             "--prompt-data: drop --task")
    for name, task in _TASK_OF.items():
        value = getattr(rollout, name)
        if value != defaults[name] and (rollout.prompt_data or rollout.task != task):
            runs = "--prompt-data" if rollout.prompt_data else f"--task {rollout.task}"
            flag = "--" + name.replace("_", "-")
            fix = "drop it" if rollout.prompt_data else f"drop it or give --task {task}"
            raise QuantrollError(f"{flag}{'' if value is True else f' {value}'} belongs to --task {task}, but this "
                                 f"run trains on {runs}, which ignores it; {fix}")


def check_across_stages(cfg) -> None:
    """What spans a TrainConfig's stages, checked before any work, one line naming the flag."""
    least = 2 if cfg.optimizer.advantage_estimator == "grpo" else 1
    if cfg.rollout.n_samples_per_prompt < least:
        raise bad("n-samples-per-prompt", f">= {least} ({cfg.optimizer.advantage_estimator} groups)",
                   cfg.rollout.n_samples_per_prompt)
    samples, minibatch = cfg.rollout.rollout_batch_size * cfg.rollout.n_samples_per_prompt, \
        cfg.optimizer.global_batch_size
    if minibatch is not None and samples % minibatch:  # Miles refuses it too: a ragged last optimizer step,
        raise QuantrollError(  # or (larger than the rollout) one step of fewer samples than asked for
            f"--global-batch-size {minibatch} does not divide the {samples} samples of a rollout "
            f"(--rollout-batch-size {cfg.rollout.rollout_batch_size} x --n-samples-per-prompt "
            f"{cfg.rollout.n_samples_per_prompt}); give a divisor of {samples}, or leave it out for one "
            "optimizer step per rollout")
    if cfg.correction.rollout_routing_replay and cfg.correction.routing_replay:  # R3 silently won
        raise QuantrollError("--use-rollout-routing-replay (the engine's experts) and --use-routing-replay (the "
                             "trainer's own, recorded) both given; the trainer replays one of them: pick one")
    recipe, rollout = cfg.precision.train_recipe, cfg.models.rollout_precision
    if recipe and rollout and rollout != recipe:  # before the conversion, not after it
        from quantroll.formats import recipe_args

        raise QuantrollError(f"{' '.join(recipe_args(recipe))} runs the trainer in {recipe} but "
                             f"--rollout-precision {rollout} converts the engine to {rollout}; give "
                             f"--rollout-precision {recipe}")
    if cfg.precision.true_on_policy_mode:
        from quantroll.rl.true_on_policy import config_refusal

        refusal = config_refusal(cfg)
        if refusal:
            raise QuantrollError(refusal)
