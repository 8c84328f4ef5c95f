"""``quantroll train``: RL with low-precision rollout and BF16 training (see quantroll/rl/loop.py).

Flag names follow Miles where Miles has one.
"""

from __future__ import annotations

import argparse
import os

import torch

from quantroll.builtin import BUILTIN_MODELS
from quantroll.commands.helpformat import HelpFormatter
from quantroll.compute import COMPUTE_DTYPE_HELP, COMPUTE_DTYPES
from quantroll.errors import QuantrollError
from quantroll.formats import FORMAT_NAMES, format_for_recipe, recipe_values
from quantroll.rl.config import TrainConfig


D = TrainConfig()  # the defaults, in one place


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="RL training: low-precision rollout, BF16 trainer, corrections, metrics",
                              description=__doc__, formatter_class=HelpFormatter)
    m = p.add_argument_group("models")
    m.add_argument("--hf-checkpoint", default=None, help="checkpoint the rollout engine loads; its quantization_config "
                   "decides the rollout precision (default: the built-in warm-started tiny Qwen3, see --builtin-model)")
    m.add_argument("--builtin-model", default="dense", choices=sorted(BUILTIN_MODELS), help="the built-in model used "
                   "when --hf-checkpoint is not given: a tiny Qwen3 warm-started on 2-digit arithmetic, dense or MoE "
                   "(8 experts, top-2)")
    m.add_argument("--rollout-precision", default=None, choices=("bf16",) + FORMAT_NAMES, help="convert the BF16 "
                   "--hf-checkpoint (or the built-in model) to this format for the engine and train on the BF16 source "
                   "(mode 1; add --fp8-recipe/--fp4-recipe for modes 2-4). Default: whatever --hf-checkpoint holds")
    m.add_argument("--convert-dir", default=None, help="where --rollout-precision writes its conversion, kept after "
                   "the run (default: a temporary directory)")
    m.add_argument("--num-layers-at-start-in-bf16", type=int, default=0, help="with --rollout-precision: keep the "
                   "first N layers in BF16 on both sides")
    m.add_argument("--num-layers-at-end-in-bf16", type=int, default=0, help="with --rollout-precision: keep the last "
                   "N layers in BF16 on both sides")
    m.add_argument("--skip", nargs="+", action="extend", default=[], metavar="PATTERN", help="with "
                   "--rollout-precision: keep matching modules in BF16 on both sides, as `quantroll convert --skip` "
                   "does ('*' crosses dots; e.g. 'model.layers.3.*', '*.mlp.down_proj'; `quantroll attribute` "
                   "proposes them)")
    m.add_argument("--ref-load", default=None, help="the trainer's BF16 weights (required when --hf-checkpoint is "
                   "quantized: mode 1)")
    m.add_argument("--kv-cache-memory-gb", type=float, default=None, help="the engine's KV cache pool in GiB; when "
                   "it runs out the engine preempts and recomputes sequences (default: 85%% of the GPU memory free "
                   "when the pool is allocated, 1 GiB on a CPU)")
    m.add_argument("--kv-cache-block-size", type=int, default=D.kv_cache_block_size, help="tokens per KV block "
                   "(a power of two): the unit of allocation, preemption and prefix sharing")
    m.add_argument("--kv-cache-dtype", default=D.kv_cache_dtype, choices=["bf16", "fp8_e4m3", "fp8"],
                   help="what the engine's KV cache stores: bf16 (the compute dtype) or E4M3 with a scale per token "
                   "and head (fp8 = fp8_e4m3); the trainer always attends in its own precision")
    m.add_argument("--keep-kv-cache", action="store_true", help="GPU: keep the engine's KV pool and decode graphs "
                   "while the trainer steps (default: release them, as colocated trainers do, so the trainer's peak "
                   "fits; the next rollout allocates and captures them again)")
    m.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device for both sides")
    m.add_argument("--compute-dtype", default="auto", choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    r = p.add_argument_group("rollout")
    r.add_argument("--task", default="arithmetic", choices=["arithmetic", "count"], help="built-in verifiable task")
    r.add_argument("--digits", type=int, default=2, help="arithmetic: digits per operand")
    r.add_argument("--train-problems", type=int, default=D.train_problems, help="built-in tasks: train on a fixed "
                   "pool of this many problems, disjoint from the held-out ones (0: a fresh problem every time)")
    r.add_argument("--eval-size", type=int, default=D.eval_size, help="built-in tasks: held-out problems evaluated "
                   "every --eval-interval steps when no --eval-data is given")
    r.add_argument("--count-span", type=int, default=16, help="count: numbers in each answer (sets response length)")
    r.add_argument("--rollout-batch-size", type=int, default=D.rollout_batch_size, help="prompts per rollout")
    r.add_argument("--n-samples-per-prompt", type=int, default=D.n_samples_per_prompt, help="samples per prompt (a GRPO group)")
    r.add_argument("--rollout-max-response-len", type=int, default=D.rollout_max_response_len, help="max new tokens per sample")
    r.add_argument("--rollout-ignore-eos", action="store_true", help="sample exactly --rollout-max-response-len "
                   "tokens (for gap-vs-length sweeps)")
    r.add_argument("--rollout-top-p", type=float, default=D.rollout_top_p, help="nucleus sampling: draw from the "
                   "smallest set of tokens holding this much probability (1: no truncation; the reported logprob is "
                   "always over the full vocabulary)")
    r.add_argument("--rollout-temperature", type=float, default=1.0, help="sampling temperature (also used for the "
                   "trainer's logprobs)")
    r.add_argument("--num-rollout", type=int, default=D.num_rollout, help="number of RL steps")
    r.add_argument("--seed", type=int, default=0, help="seed for prompts and sampling")
    r.add_argument("--prompt-data", default=None, help="JSONL prompts to train on instead of the built-in task")
    r.add_argument("--input-key", default="prompt", help="JSONL key of the prompt text")
    r.add_argument("--label-key", default="label", help="JSONL key of the label the reward checks")
    r.add_argument("--custom-rm-path", default=None, help="reward function 'module:function(response, label) -> "
                   "float' (default: exact match with the label)")
    r.add_argument("--eval-data", default=None, help="JSONL held-out prompts: greedy accuracy of the engine's and the "
                   "trainer's BF16 policy")
    r.add_argument("--eval-interval", type=int, default=0, help="held-out greedy accuracy at step 0, every N steps "
                   "and at the last step, each before that step's rollout (0: never)")
    o = p.add_argument_group("optimization")
    o.add_argument("--global-batch-size", type=int, default=None, help="samples per optimizer step (default: the "
                   "whole rollout, one step per rollout)")
    o.add_argument("--micro-batch-size", type=int, default=None, help="samples per forward pass; gradients of the "
                   "micro-batches of one optimizer step are accumulated (default: the whole --global-batch-size)")
    o.add_argument("--lr", type=float, default=D.lr, help="AdamW learning rate (FP32 master weights)")
    o.add_argument("--advantage-estimator", default="grpo", choices=["grpo", "reinforce_plus_plus"], help="advantages")
    o.add_argument("--eps-clip", type=float, default=0.2, help="PPO clip range (low side)")
    o.add_argument("--eps-clip-high", type=float, default=None, help="PPO clip range, high side (default: --eps-clip)")
    o.add_argument("--use-kl-loss", action="store_true", help="add a KL loss against the initial policy")
    o.add_argument("--kl-loss-coef", type=float, default=0.0, help="weight of the KL loss")
    o.add_argument("--kl-loss-type", default="low_var_kl", choices=["k1", "k2", "k3", "low_var_kl"], help="KL estimator")
    o.add_argument("--loss-agg", default="token-mean", choices=["token-mean", "seq-mean-token-mean"],
                   help="loss aggregation over response tokens")
    c = p.add_argument_group("corrections")
    c.add_argument("--use-tis", action="store_true", help="importance-sampling correction train/rollout")
    c.add_argument("--tis-mode", default="truncate", choices=["truncate", "mask"], help="truncate (TIS) or mask "
                   "(IcePop/MIS)")
    c.add_argument("--tis-level", default="token", choices=["token", "sequence", "geometric"], help="ratio level")
    c.add_argument("--tis-clip", type=float, default=None, help="upper bound C (default: 2.0 truncate, 5.0 mask)")
    c.add_argument("--tis-clip-low", type=float, default=None, help="lower bound c (default: 0 truncate, 0.5 mask)")
    c.add_argument("--use-rollout-routing-replay", action="store_true", help="R3: the trainer uses the experts the "
                   "engine chose (MoE)")
    c.add_argument("--use-routing-replay", action="store_true", help="record routing in the old-logprob pass and "
                   "replay it in training (MoE)")
    q = p.add_argument_group("unified low precision (modes 2-4)")
    q.add_argument("--fp8-recipe", default=None, choices=recipe_values("--fp8-recipe"), help="trainer forward in block FP8 "
                   "(mode 2) or MXFP8 (mode 3), backward in BF16")
    q.add_argument("--fp8-format", default="e4m3", choices=["e4m3"], help="FP8 element format")
    q.add_argument("--fp4-recipe", default=None, choices=recipe_values("--fp4-recipe"), help="trainer forward in NVFP4 (mode 4)")
    t = p.add_argument_group("true on-policy")
    t.add_argument("--true-on-policy-mode", action="store_true", help="batch-invariant kernels in the engine and "
                   "the trainer's forward, so that every sampled token's rollout logprob equals the trainer's bit for "
                   "bit (gap exactly 0.0): BF16 on both sides or mode 2; CPU only in this build; refused for mode 1 "
                   "and an FP8 KV cache")
    w = p.add_argument_group("weight update check")
    w.add_argument("--check-weight-update-equal", action="store_true", help="before training, check that the first "
                   "weight update reproduces every engine tensor")
    w.add_argument("--check-weight-update-allow-quant-error", action="store_true", help="compare dequantized values "
                   "within one ULP per side instead of bitwise")
    out = p.add_argument_group("output")
    out.add_argument("--metrics-file", default=None, help="JSONL file, one line per step")
    out.add_argument("--tensorboard-dir", default=None, help="also write the scalars for TensorBoard (needs the "
                     "tensorboard package)")
    out.add_argument("--save", default=None, help="directory for resumable state (model, optimizer, RNG, step)")
    out.add_argument("--save-interval", type=int, default=0, help="save every N steps and at the end (0: never)")
    out.add_argument("--save-hf", default=None, help="at the end, export the trained policy as an HF BF16 checkpoint "
                     "(loads in transformers and `quantroll convert`)")
    out.add_argument("--load", default=None, help="resume from a --save directory; the metrics file continues")
    out.add_argument("--force", action="store_true", help="start over: replace the run that --save and "
                     "--metrics-file hold (without it, a fresh run refuses them: resume with --load)")
    pl = p.add_argument_group("placement across processes (Ray; Miles' flag names)", "Give any of these to start "
                              "the ranks as Ray actors (pip install -e '.[ray]'); without them, torchrun "
                              "--nproc-per-node N -m quantroll train ... starts them (see README, 'Across processes')")
    pl.add_argument("--actor-num-nodes", type=int, default=None, help="nodes of trainer ranks (default 1)")
    pl.add_argument("--actor-num-gpus-per-node", type=int, default=None, help="trainer ranks per node, one GPU each "
                    "(on --device cpu: one process each; default 1)")
    pl.add_argument("--rollout-num-gpus", type=int, default=None, help="GPUs of the engines, one engine each; with "
                    "--colocate the trainer's GPUs (default: that many)")
    pl.add_argument("--colocate", action="store_true", help="trainer ranks and engines share GPUs: each rank holds "
                    "one trainer shard and one engine, which releases its KV cache while the trainer steps")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    if args.fp8_recipe and args.fp4_recipe:
        raise QuantrollError(f"--fp8-recipe {args.fp8_recipe} and --fp4-recipe {args.fp4_recipe} both given; the "
                             "trainer runs one recipe, pick one")
    recipe = format_for_recipe("--fp8-recipe", args.fp8_recipe) or format_for_recipe("--fp4-recipe", args.fp4_recipe)
    return TrainConfig(
        hf_checkpoint=args.hf_checkpoint, ref_load=args.ref_load, builtin_model=args.builtin_model,
        rollout_precision=args.rollout_precision, convert_dir=args.convert_dir,
        num_layers_at_start_in_bf16=args.num_layers_at_start_in_bf16,
        num_layers_at_end_in_bf16=args.num_layers_at_end_in_bf16, skip=tuple(args.skip),
        rollout_ignore_eos=args.rollout_ignore_eos,
        device=args.device, compute_dtype=args.compute_dtype,
        kv_cache_memory_gb=args.kv_cache_memory_gb, kv_cache_block_size=args.kv_cache_block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        keep_kv_cache=args.keep_kv_cache, micro_batch_size=args.micro_batch_size, task=args.task,
        digits=args.digits, count_span=args.count_span, train_problems=args.train_problems, eval_size=args.eval_size, rollout_batch_size=args.rollout_batch_size,
        n_samples_per_prompt=args.n_samples_per_prompt, rollout_max_response_len=args.rollout_max_response_len,
        rollout_temperature=args.rollout_temperature, rollout_top_p=args.rollout_top_p, num_rollout=args.num_rollout, seed=args.seed,
        prompt_data=args.prompt_data, input_key=args.input_key, label_key=args.label_key,
        custom_rm_path=args.custom_rm_path, eval_data=args.eval_data, eval_interval=args.eval_interval,
        global_batch_size=args.global_batch_size, lr=args.lr, advantage_estimator=args.advantage_estimator,
        eps_clip=args.eps_clip, eps_clip_high=args.eps_clip_high, use_kl_loss=args.use_kl_loss,
        kl_loss_coef=args.kl_loss_coef, kl_loss_type=args.kl_loss_type, loss_agg=args.loss_agg, use_tis=args.use_tis,
        tis_mode=args.tis_mode, tis_level=args.tis_level, tis_clip=args.tis_clip, tis_clip_low=args.tis_clip_low,
        use_rollout_routing_replay=args.use_rollout_routing_replay, use_routing_replay=args.use_routing_replay,
        train_recipe=recipe, true_on_policy_mode=args.true_on_policy_mode,
        check_weight_update_equal=args.check_weight_update_equal,
        check_weight_update_allow_quant_error=args.check_weight_update_allow_quant_error,
        metrics_file=args.metrics_file, tensorboard_dir=args.tensorboard_dir, save=args.save, save_interval=args.save_interval, load=args.load, save_hf=args.save_hf,
        force=args.force)


def ray_placement(args: argparse.Namespace):
    """The Ray placement the flags ask for, or None (no placement flag given)."""
    flags = (args.actor_num_nodes, args.actor_num_gpus_per_node, args.rollout_num_gpus)
    if all(f is None for f in flags) and not args.colocate:
        return None
    from quantroll.dist.ray_launch import RayPlacement

    return RayPlacement(args.actor_num_nodes or 1, args.actor_num_gpus_per_node or 1, args.rollout_num_gpus,
                        args.colocate)


def run(args: argparse.Namespace) -> int:
    import functools

    from quantroll.rl.loop import run_training

    cfg = config_from_args(args)
    placement = ray_placement(args)
    if placement is not None:
        if "WORLD_SIZE" in os.environ:
            raise QuantrollError("the Ray placement flags were given inside a torchrun rank; start quantroll either "
                                 "with torchrun or with the flags, not both")
        from quantroll.dist.ray_launch import import_ray, launch

        import_ray()  # refused before any work when Ray is missing
        history = launch(functools.partial(run_training, cfg), placement, cfg.device)
    else:
        history = run_training(cfg)
    if os.environ.get("RANK", "0") != "0":  # a rank of a multi-process run: rank 0 says it
        return 0
    last = history[-1]
    print(f"{len(history)} steps; last reward {last['reward_mean']:.3f}, "
          f"gap |logp diff| {last['train_rollout_logprob_abs_diff']:.3e}, rollout {last['rollout_precision']}")
    return 0
