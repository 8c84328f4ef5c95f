"""Everything ``quantroll train`` is asked to do: one frozen dataclass per stage of a step.

    TrainConfig
      models      which checkpoints, the rollout precision's conversion, device and dtype
      engine      the KV cache: budget, block size, dtype, release while training
      rollout     task and data, prompts x samples, sampling, steps, seed, evaluation
      optimizer   batches, learning rate, policy loss, KL loss, aggregation
      correction  TIS / mask and routing replay (trainer/corrections.CorrectionConfig)
      precision   the trainer's recipe (modes 2-4), true on-policy
      sync        the first weight update's check
      output      metrics, checkpoints (save / load / export), the run's guards

The command line is flat (Miles' flag names: ``--rollout-batch-size``, ``--use-tis``); every
flag's dest is the name of exactly one field (``FLAGS``; a field's metadata says its flag
where the two names differ, as CorrectionConfig's do), so ``TrainConfig.of(**flags)`` builds
the nested value and commands/train.py takes every default from here (``flag_defaults``).
Each stage checks its own values when built; TrainConfig checks what spans stages
(rl/config_checks.py); a config file is read by rl/config_json.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from quantroll.errors import QuantrollError
from quantroll.rl.config_checks import (FLOAT32_MAX, SEED_LIMIT, at_least, bad, check_across_stages, non_negative,
                                        positive, refuse_other_task_flags)
from quantroll.rl.config_json import stages_from_json
from quantroll.trainer.corrections import CorrectionConfig

@dataclass(frozen=True)
class ModelsConfig:
    hf_checkpoint: str | None = None  # None: the built-in warm-started model (builtin_model)
    ref_load: str | None = None
    builtin_model: str = "dense"  # "dense" or "moe"
    rollout_precision: str | None = None  # convert hf_checkpoint (BF16) to this format for the engine
    convert_dir: str | None = None
    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0
    skip: tuple[str, ...] = ()  # with rollout_precision: convert's --skip patterns, kept BF16 on both sides
    device: str = "cpu"
    compute_dtype: str = "auto"  # quantroll/compute.py: bfloat16 on GPU, float32 on CPU

    def __post_init__(self):
        object.__setattr__(self, "skip", tuple(self.skip))
        if self.hf_checkpoint and self.builtin_model != "dense":  # was ignored silently
            raise QuantrollError(f"--builtin-model {self.builtin_model} picks the model when --hf-checkpoint is not "
                                 "given; drop one of them")
        at_least(num_layers_at_start_in_bf16=(self.num_layers_at_start_in_bf16, 0),
                  num_layers_at_end_in_bf16=(self.num_layers_at_end_in_bf16, 0))


@dataclass(frozen=True)
class EngineConfig:
    kv_cache_memory_gb: float | None = None  # None: a fraction of the free GPU memory, 1 GiB on a CPU
    kv_cache_block_size: int = 16  # tokens per KV block (allocation, preemption and prefix sharing unit)
    kv_cache_dtype: str = "bf16"  # the engine's KV cache: bf16 (the compute dtype) or fp8_e4m3
    keep_kv_cache: bool = False  # GPU: keep the engine's KV pool while the trainer steps (default: release it)
    # decode steps between two looks of the host (SGLang's name); None: the engine's own (8 on a GPU, 1 on a CPU)
    num_continuous_decode_steps: int | None = None

    def __post_init__(self):
        from quantroll.engine.paged_cache import kv_cache_dtype_name

        object.__setattr__(self, "kv_cache_dtype", kv_cache_dtype_name(self.kv_cache_dtype))
        positive(kv_cache_memory_gb=self.kv_cache_memory_gb)
        if self.num_continuous_decode_steps is not None:
            at_least(num_continuous_decode_steps=(self.num_continuous_decode_steps, 1))

    def cache(self):
        """The KV pool these settings ask for (the held-out evaluation's copy takes it with a BF16 cache)."""
        from quantroll.engine.paged_cache import CacheConfig

        return CacheConfig(memory_gb=self.kv_cache_memory_gb, kv_cache_dtype=self.kv_cache_dtype,
                           block_size=self.kv_cache_block_size)

    def scheduler(self):
        """The engines' batching policy these settings ask for (the rollout engine's and the
        held-out evaluation's copy alike)."""
        from quantroll.engine.scheduler import SchedulerConfig

        return SchedulerConfig(decode_steps=self.num_continuous_decode_steps)


@dataclass(frozen=True)
class RolloutConfig:
    task: str = "arithmetic"
    digits: int = 2
    count_span: int = 16
    trace_len: int = 1024  # fib: target response length in tokens (tasks/trace.py)
    trace_terms: int = 2  # fib: 2 (Fibonacci) or 3 (Tribonacci, harder)
    trace_partial_credit: bool = False  # fib: reward the leading correct lines' fraction when not exactly right
    train_problems: int = 64  # built-in tasks: the training pool's size (0: fresh problems)
    eval_size: int = 64  # built-in tasks: held-out problems when evaluating without eval_data
    rollout_batch_size: int = 16
    n_samples_per_prompt: int = 8
    rollout_max_response_len: int = 8
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0  # nucleus sampling (truncation changes what is drawn, never the reported logprob)
    rollout_ignore_eos: bool = False  # sample exactly rollout_max_response_len tokens (length sweeps)
    num_rollout: int = 30
    seed: int = 0
    prompt_data: str | None = None
    input_key: str = "prompt"
    label_key: str = "label"
    custom_rm_path: str | None = None
    eval_data: str | None = None
    eval_interval: int = 0

    def __post_init__(self):
        at_least(rollout_batch_size=(self.rollout_batch_size, 1),
                  rollout_max_response_len=(self.rollout_max_response_len, 1), num_rollout=(self.num_rollout, 1),
                  digits=(self.digits, 1), count_span=(self.count_span, 1), trace_len=(self.trace_len, 1), eval_size=(self.eval_size, 1),
                  train_problems=(self.train_problems, 0), eval_interval=(self.eval_interval, 0),
                  seed=(self.seed, 0))
        refuse_other_task_flags(self, {f.name: f.default for f in dataclasses.fields(RolloutConfig)})
        if self.custom_rm_path and not self.prompt_data:  # the built-in tasks score with their own reward
            raise QuantrollError(f"--custom-rm-path {self.custom_rm_path} scores --prompt-data; the built-in task "
                                 "scores with its own reward and would ignore it: add --prompt-data F.jsonl or drop it")
        if self.eval_data and not self.eval_interval:
            raise QuantrollError(f"--eval-data {self.eval_data} is set but --eval-interval is 0 (never evaluate); "
                                 "add --eval-interval N")
        non_negative(rollout_temperature=self.rollout_temperature)
        if not (math.isfinite(self.rollout_top_p) and 0 < self.rollout_top_p <= 1):
            raise bad("rollout-top-p", "in (0, 1]", self.rollout_top_p)
        if self.seed >= SEED_LIMIT:
            raise bad("seed", "below 2^64 (torch's generators take 64-bit seeds)", self.seed)
        if self.rollout_temperature == 0:
            raise QuantrollError("--rollout-temperature 0 samples greedily: the n samples of a prompt come out the same, "
                                 "so every GRPO group has zero reward variance and nothing is learned (loss 0); use a "
                                 "temperature > 0, e.g. 1.0 (evaluation is greedy on its own)")


@dataclass(frozen=True)
class OptimizerConfig:
    global_batch_size: int | None = None  # None: the whole rollout batch, one step per rollout
    micro_batch_size: int | None = None  # sequences per forward pass (gradients accumulated); None: the minibatch
    lr: float = 2e-4
    max_grad_norm: float = 1.0
    advantage_estimator: str = "grpo"
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    loss_agg: str = "token-mean"

    def __post_init__(self):
        for name, value in (("global-batch-size", self.global_batch_size), ("micro-batch-size", self.micro_batch_size)):
            if value is not None and value < 1:
                raise bad(name, ">= 1", value)
        positive(lr=self.lr, max_grad_norm=self.max_grad_norm, eps_clip=self.eps_clip, eps_clip_high=self.eps_clip_high)
        if self.lr > FLOAT32_MAX:  # AdamW steps FP32 master weights: torch's optimizer cannot even take such an lr
            raise bad("lr", f"at most {FLOAT32_MAX:.4g} (the FP32 master weights' range)", self.lr)
        non_negative(kl_loss_coef=self.kl_loss_coef)
        if self.kl_loss_coef and not self.use_kl_loss:
            raise QuantrollError("--kl-loss-coef is set but --use-kl-loss is not; add --use-kl-loss or drop the coefficient")
        if self.kl_loss_type != "low_var_kl" and not self.use_kl_loss:  # was ignored silently
            raise QuantrollError(f"--kl-loss-type {self.kl_loss_type} is set but --use-kl-loss is not; add "
                                 "--use-kl-loss --kl-loss-coef C or drop it")
        if self.use_kl_loss and not self.kl_loss_coef:
            raise QuantrollError("--use-kl-loss needs a positive --kl-loss-coef")


@dataclass(frozen=True)
class PrecisionConfig:
    train_recipe: str | None = None  # the trainer's forward: "fp8" (blockwise), "mxfp8", "nvfp4" (modes 2-4)
    true_on_policy_mode: bool = False  # engine and trainer logprobs bitwise equal (rl/true_on_policy.py)


@dataclass(frozen=True)
class SyncConfig:
    check_weight_update_equal: bool = False
    check_weight_update_allow_quant_error: bool = False

    def __post_init__(self):
        if self.check_weight_update_allow_quant_error and not self.check_weight_update_equal:  # was ignored silently
            raise QuantrollError("--check-weight-update-allow-quant-error loosens --check-weight-update-equal, "
                                 "which is not given; add it or drop the first")


@dataclass(frozen=True)
class OutputConfig:
    metrics_file: str | None = None
    tensorboard_dir: str | None = None
    save: str | None = None
    save_interval: int = 0
    load: str | None = None
    save_hf: str | None = None
    force: bool = False  # start over: replace the run held by --save and --metrics-file
    max_bad_steps: int = 3

    def __post_init__(self):
        at_least(save_interval=(self.save_interval, 0))
        if self.force and self.load:
            raise QuantrollError("--force starts the run over and --load resumes it; pick one")
        if self.save and not self.save_interval:
            raise QuantrollError("--save needs --save-interval N (the state is written every N steps and at the end)")
        if self.save_interval and not self.save:
            raise QuantrollError("--save-interval is set but --save is not; add --save DIR or drop it")


@dataclass(frozen=True)
class TrainConfig:
    models: ModelsConfig = field(default_factory=ModelsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self):
        check_across_stages(self)

    @classmethod
    def of(cls, **flags) -> TrainConfig:
        """The nested value from the command line's flat names (``FLAGS``: each flag's dest
        to its stage and field); what is not given keeps its default."""
        unknown = sorted(set(flags) - set(FLAGS))
        if unknown:
            raise TypeError(f"TrainConfig.of: no flag {', '.join(unknown)}")
        stages: dict[str, dict] = {}
        for name, value in flags.items():
            stage, attr = FLAGS[name]
            stages.setdefault(stage, {})[attr] = value
        unused = CorrectionConfig.unused_flags(stages.get("correction", {}))
        if any(flag in unused for flag in ("--tis-clip", "--tis-clip-low")):
            raise QuantrollError("--tis-clip/--tis-clip-low are set but --use-tis is not; add --use-tis or drop them")
        if unused:
            value = flags[unused[0][2:].replace("-", "_")]
            raise QuantrollError(f"{unused[0]} {value} is set but --use-tis is not; add --use-tis or drop it")
        return cls(**{stage: _STAGES[stage](**values) for stage, values in stages.items()})

    def flat(self) -> dict:
        """The inverse of ``of``: every flag's dest with this config's value."""
        return {name: getattr(getattr(self, stage), attr) for name, (stage, attr) in FLAGS.items()}

    def to_json(self) -> str:
        """The whole configuration, by stage (what `quantroll compare` hands each run)."""
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> TrainConfig:
        """The inverse of ``to_json``, strict: an unknown stage or key, or a value of the
        wrong type, is one line naming ``source`` and the key; a missing key keeps its
        default; every stage's own checks then run as for the command line."""
        return cls(**stages_from_json(text, source, _STAGES))


def _stage_types() -> dict[str, type]:
    hints = {"models": ModelsConfig, "engine": EngineConfig, "rollout": RolloutConfig, "optimizer": OptimizerConfig,
             "correction": CorrectionConfig, "precision": PrecisionConfig, "sync": SyncConfig, "output": OutputConfig}
    assert set(hints) == {f.name for f in dataclasses.fields(TrainConfig)}, "a stage without its type"
    return hints


def _flags() -> dict[str, tuple[str, str]]:
    """flag dest -> (stage, field): the field's ``metadata['flag']`` where it has one (a
    stage shared with other callers, e.g. CorrectionConfig), else its own name."""
    out: dict[str, tuple[str, str]] = {}
    for stage, kind in _STAGES.items():
        for f in dataclasses.fields(kind):
            name = f.metadata.get("flag", f.name)
            assert name not in out, f"flag {name} belongs to two fields"
            out[name] = (stage, f.name)
    return out


_STAGES = _stage_types()
FLAGS = _flags()


def flag_defaults() -> dict:
    """Every flag's default, from the dataclasses (the one place defaults are written)."""
    return TrainConfig().flat()
