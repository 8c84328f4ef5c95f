"""Everything ``quantroll train`` is asked to do, as one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    hf_checkpoint: str
    ref_load: str | None = None
    device: str = "cpu"
    kv_cache_memory_gb: float | None = None
    # rollout
    task: str = "arithmetic"
    digits: int = 2
    count_span: int = 16
    rollout_batch_size: int = 8
    n_samples_per_prompt: int = 4
    rollout_max_response_len: int = 8
    rollout_temperature: float = 1.0
    num_rollout: int = 10
    seed: int = 0
    prompt_data: str | None = None
    input_key: str = "prompt"
    label_key: str = "label"
    custom_rm_path: str | None = None
    eval_data: str | None = None
    eval_interval: int = 0
    # optimization
    global_batch_size: int | None = None  # None: the whole rollout batch, one step per rollout
    lr: float = 1e-5
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
    max_bad_steps: int = 3
