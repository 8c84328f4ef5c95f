"""Everything ``quantroll train`` is asked to do, as one frozen dataclass."""

from __future__ import annotations

import math
from dataclasses import dataclass

from quantroll.errors import QuantrollError

SEED_LIMIT = 2**64


@dataclass(frozen=True)
class TrainConfig:
    hf_checkpoint: str | None = None  # None: the built-in warm-started model (builtin_model)
    ref_load: str | None = None
    builtin_model: str = "dense"  # "dense" or "moe"
    rollout_precision: str | None = None  # convert hf_checkpoint (BF16) to this format for the engine
    convert_dir: str | None = None
    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0
    skip: tuple[str, ...] = ()  # with rollout_precision: convert's --skip patterns, kept BF16 on both sides
    device: str = "cpu"
    kv_cache_memory_gb: float | None = None
    kv_cache_block_size: int = 16  # tokens per KV block (allocation, preemption and prefix sharing unit)
    kv_cache_dtype: str = "bf16"  # the engine's KV cache: bf16 (the compute dtype) or fp8_e4m3
    keep_kv_cache: bool = False  # GPU: keep the engine's KV pool while the trainer steps (default: release it)
    compute_dtype: str = "auto"  # quantroll/compute.py: bfloat16 on GPU, float32 on CPU
    # rollout
    task: str = "arithmetic"
    digits: int = 2
    count_span: int = 16
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
    # optimization
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
    # corrections
    use_tis: bool = False
    tis_mode: str = "truncate"
    tis_level: str = "token"
    tis_clip: float | None = None
    tis_clip_low: float | None = None
    use_rollout_routing_replay: bool = False
    use_routing_replay: bool = False
    # unified low precision in the trainer (modes 2-4)
    train_recipe: str | None = None  # "fp8" (blockwise), "mxfp8", "nvfp4"
    # engine and trainer logprobs bitwise equal (rl/true_on_policy.py)
    true_on_policy_mode: bool = False
    # weight update check
    check_weight_update_equal: bool = False
    check_weight_update_allow_quant_error: bool = False
    # output
    metrics_file: str | None = None
    tensorboard_dir: str | None = None
    save: str | None = None
    save_interval: int = 0
    load: str | None = None
    save_hf: str | None = None
    force: bool = False  # start over: replace the run held by --save and --metrics-file
    max_bad_steps: int = 3

    def _check_tis_bounds(self) -> None:
        """The bounds the correction will use, defaults included, must satisfy c < C: a
        bound checked only when both are given let `--tis-clip-low 3` (against the
        default C = 2) through to a correction that clips everything."""
        if not self.use_tis:
            for flag, value, default in (("tis-mode", self.tis_mode, "truncate"), ("tis-level", self.tis_level, "token")):
                if value != default:
                    raise QuantrollError(f"--{flag} {value} is set but --use-tis is not; add --use-tis or drop it")
            return
        from quantroll.trainer.corrections import DEFAULT_BOUNDS

        if self.tis_mode not in DEFAULT_BOUNDS:
            raise QuantrollError(f"--tis-mode {self.tis_mode!r}: choose one of {', '.join(DEFAULT_BOUNDS)}")
        low_default, high_default = DEFAULT_BOUNDS[self.tis_mode]
        low = low_default if self.tis_clip_low is None else self.tis_clip_low
        high = high_default if self.tis_clip is None else self.tis_clip
        if not low < high:
            name_low = f"--tis-clip-low {low}" if self.tis_clip_low is not None else f"the {self.tis_mode} default low bound {low}"
            name_high = f"--tis-clip {high}" if self.tis_clip is not None else f"the {self.tis_mode} default --tis-clip {high}"
            raise QuantrollError(f"{name_low} must be below {name_high}; give both bounds with c < C")

    def __post_init__(self):
        """Every numeric setting checked before any work, one line naming the flag."""
        def bad(flag: str, what: str, value) -> QuantrollError:
            return QuantrollError(f"--{flag} must be {what}, got {value!r}")

        for flag, value, least in (("rollout-batch-size", self.rollout_batch_size, 1),
                                   ("rollout-max-response-len", self.rollout_max_response_len, 1),
                                   ("num-rollout", self.num_rollout, 1), ("digits", self.digits, 1),
                                   ("count-span", self.count_span, 1), ("eval-size", self.eval_size, 1),
                                   ("train-problems", self.train_problems, 0), ("eval-interval", self.eval_interval, 0),
                                   ("save-interval", self.save_interval, 0), ("seed", self.seed, 0),
                                   ("num-layers-at-start-in-bf16", self.num_layers_at_start_in_bf16, 0),
                                   ("num-layers-at-end-in-bf16", self.num_layers_at_end_in_bf16, 0)):
            if value < least:
                raise bad(flag, f">= {least}", value)
        least = 2 if self.advantage_estimator == "grpo" else 1
        if self.n_samples_per_prompt < least:
            raise bad("n-samples-per-prompt", f">= {least} ({self.advantage_estimator} groups)", self.n_samples_per_prompt)
        if self.global_batch_size is not None and self.global_batch_size < 1:
            raise bad("global-batch-size", ">= 1", self.global_batch_size)
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise bad("micro-batch-size", ">= 1", self.micro_batch_size)
        from quantroll.engine.paged_cache import kv_cache_dtype_name

        object.__setattr__(self, "kv_cache_dtype", kv_cache_dtype_name(self.kv_cache_dtype))
        for flag, value in (("lr", self.lr), ("eps-clip", self.eps_clip), ("eps-clip-high", self.eps_clip_high),
                            ("kv-cache-memory-gb", self.kv_cache_memory_gb), ("tis-clip", self.tis_clip)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise bad(flag, "a finite number > 0", value)
        for flag, value in (("kl-loss-coef", self.kl_loss_coef), ("tis-clip-low", self.tis_clip_low),
                            ("rollout-temperature", self.rollout_temperature)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise bad(flag, "a finite number >= 0", value)
        if not (math.isfinite(self.rollout_top_p) and 0 < self.rollout_top_p <= 1):
            raise bad("rollout-top-p", "in (0, 1]", self.rollout_top_p)
        if self.kl_loss_coef and not self.use_kl_loss:
            raise QuantrollError("--kl-loss-coef is set but --use-kl-loss is not; add --use-kl-loss or drop the coefficient")
        if self.use_kl_loss and not self.kl_loss_coef:
            raise QuantrollError("--use-kl-loss needs a positive --kl-loss-coef")
        if (self.tis_clip is not None or self.tis_clip_low is not None) and not self.use_tis:
            raise QuantrollError("--tis-clip/--tis-clip-low are set but --use-tis is not; add --use-tis or drop them")
        self._check_tis_bounds()
        if self.seed >= SEED_LIMIT:
            raise bad("seed", "below 2^64 (torch's generators take 64-bit seeds)", self.seed)
        if self.rollout_temperature == 0:
            raise QuantrollError("--rollout-temperature 0 samples greedily: the n samples of a prompt come out the same, "
                                 "so every GRPO group has zero reward variance and nothing is learned (loss 0); use a "
                                 "temperature > 0, e.g. 1.0 (evaluation is greedy on its own)")
        if self.force and self.load:
            raise QuantrollError("--force starts the run over and --load resumes it; pick one")
        if self.save and not self.save_interval:
            raise QuantrollError("--save needs --save-interval N (the state is written every N steps and at the end)")
        if self.save_interval and not self.save:
            raise QuantrollError("--save-interval is set but --save is not; add --save DIR or drop it")
        if self.true_on_policy_mode:
            from quantroll.rl.true_on_policy import config_refusal

            refusal = config_refusal(self)
            if refusal:
                raise QuantrollError(refusal)
