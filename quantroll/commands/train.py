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
from quantroll.errors import Interrupted, QuantrollError
from quantroll.formats import FORMAT_NAMES, format_for_recipe, recipe_values
from quantroll.outputs import FORCE_HELP
from quantroll.rl.config import FLAGS, TrainConfig, flag_defaults


# flags that are not fields of TrainConfig: the recipes (they set precision.train_recipe), the
# FP8 element format (one choice), and the placement across processes
CLI_ONLY = ("fp8_recipe", "fp4_recipe", "fp8_format", "actor_num_nodes", "actor_num_gpus_per_node",
            "rollout_num_gpus", "colocate")
# fields without a flag of their own (train_recipe comes from the recipe flags)
NOT_FLAGS = ("train_recipe", "max_bad_steps")
DEFAULT_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the command line's; TrainConfig's is cpu


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="RL training: low-precision rollout, BF16 trainer, corrections, metrics",
                              description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--config", default=None, metavar="FILE", help="the run's whole configuration as JSON, by stage "
                   "(what `quantroll compare` writes for each run as config.json); no other setting beside it")
    m = p.add_argument_group("models")
    m.add_argument("--hf-checkpoint", help="checkpoint the rollout engine loads; its quantization_config "
                   "decides the rollout precision (default: the built-in warm-started tiny Qwen3, see --builtin-model)")
    m.add_argument("--builtin-model", choices=sorted(BUILTIN_MODELS), help="the built-in model used "
                   "when --hf-checkpoint is not given: a tiny Qwen3 warm-started on 2-digit arithmetic, dense or MoE "
                   "(8 experts, top-2)")
    m.add_argument("--rollout-precision", choices=("bf16",) + FORMAT_NAMES, help="convert the BF16 "
                   "--hf-checkpoint (or the built-in model) to this format for the engine and train on the BF16 source "
                   "(mode 1; add --fp8-recipe/--fp4-recipe for modes 2-4). Default: whatever --hf-checkpoint holds")
    m.add_argument("--convert-dir", help="where --rollout-precision writes its conversion, kept after "
                   "the run and replaced by the next run's when quantroll wrote all of it, --force or not (it is "
                   "a cache; any other file there is refused) (default: a temporary directory)")
    m.add_argument("--num-layers-at-start-in-bf16", type=int, help="with --rollout-precision: keep the "
                   "first N layers in BF16 on both sides")
    m.add_argument("--num-layers-at-end-in-bf16", type=int, help="with --rollout-precision: keep the last "
                   "N layers in BF16 on both sides")
    m.add_argument("--skip", nargs="+", action="extend", metavar="PATTERN", help="with "
                   "--rollout-precision: keep matching modules in BF16 on both sides, as `quantroll convert --skip` "
                   "does ('*' crosses dots; e.g. 'model.layers.3.*', '*.mlp.down_proj'; `quantroll attribute` "
                   "proposes them)")
    m.add_argument("--ref-load", help="the trainer's BF16 weights (required when --hf-checkpoint is "
                   "quantized: mode 1)")
    m.add_argument("--kv-cache-memory-gb", type=float, help="the engine's KV cache pool in GiB; when "
                   "it runs out the engine preempts and recomputes sequences (default: 85%% of the GPU memory free "
                   "when the pool is allocated, 1 GiB on a CPU)")
    m.add_argument("--kv-cache-block-size", type=int, help="tokens per KV block "
                   "(a power of two): the unit of allocation, preemption and prefix sharing")
    m.add_argument("--kv-cache-dtype", choices=["bf16", "fp8_e4m3", "fp8"],
                   help="what the engine's KV cache stores: bf16 (the compute dtype) or E4M3 with a scale per token "
                   "and head (fp8 = fp8_e4m3); the trainer always attends in its own precision")
    m.add_argument("--keep-kv-cache", action="store_true", help="GPU: keep the engine's KV pool and decode graphs "
                   "while the trainer steps (default: release them, as colocated trainers do, so the trainer's peak "
                   "fits; the next rollout allocates and captures them again)")
    m.add_argument("--num-continuous-decode-steps", type=int, metavar="N", help="decode steps the engine runs between two "
                   "looks of the host (SGLang's flag): the host's scheduling and bookkeeping, during which the GPU "
                   "waits, is paid once per N steps; a sequence that stops mid-way computes (and discards) the rest "
                   "of the N. Samples do not depend on N (as on any schedule, up to batch-variant rounding). "
                   "Larger suits long responses (default: 8 on a GPU, 1 on a CPU)")
    m.add_argument("--device", default=DEFAULT_DEVICE, help="device for both sides")
    m.add_argument("--compute-dtype", choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    r = p.add_argument_group("rollout")
    r.add_argument("--task", choices=["arithmetic", "count", "fib"], help="built-in verifiable task (fib: a long "
                   "scratchpad of Fibonacci lines mod 10^4 whose length --trace-len sets)")
    r.add_argument("--digits", type=int, help="arithmetic: digits per operand")
    r.add_argument("--train-problems", type=int, help="built-in tasks: train on a fixed "
                   "pool of this many problems, disjoint from the held-out ones (0: a fresh problem every time)")
    r.add_argument("--eval-size", type=int, help="built-in tasks: held-out problems evaluated "
                   "every --eval-interval steps when no --eval-data is given")
    r.add_argument("--count-span", type=int, help="count: numbers in each answer (sets response length)")
    r.add_argument("--trace-len", type=int, help="fib: target response length in tokens (lines drawn within "
                   "+-20%%); --rollout-max-response-len must cover the longest")
    r.add_argument("--trace-terms", type=int, choices=[2, 3], help="fib: terms summed per line, 2 (Fibonacci) or "
                   "3 (Tribonacci, harder)")
    r.add_argument("--trace-partial-credit", action="store_true", help="fib: a trace not exactly right scores the "
                   "fraction of its leading correct lines (default: 0)")
    r.add_argument("--rollout-batch-size", type=int, help="prompts per rollout")
    r.add_argument("--n-samples-per-prompt", type=int, help="samples per prompt (a GRPO group)")
    r.add_argument("--rollout-max-response-len", type=int, help="max new tokens per sample")
    r.add_argument("--rollout-ignore-eos", action="store_true", help="sample exactly --rollout-max-response-len "
                   "tokens (for gap-vs-length sweeps)")
    r.add_argument("--rollout-top-p", type=float, help="nucleus sampling: draw from the "
                   "smallest set of tokens holding this much probability (1: no truncation; the reported logprob is "
                   "always over the full vocabulary)")
    r.add_argument("--rollout-temperature", type=float, help="sampling temperature (also used for the "
                   "trainer's logprobs)")
    r.add_argument("--num-rollout", type=int, help="number of RL steps")
    r.add_argument("--seed", type=int, help="seed for prompts and sampling")
    r.add_argument("--prompt-data", help="JSONL prompts to train on instead of the built-in task")
    r.add_argument("--input-key", help="JSONL key of the prompt text")
    r.add_argument("--label-key", help="JSONL key of the label the reward checks")
    r.add_argument("--custom-rm-path", help="reward function 'module:function(response, label) -> "
                   "float' (default: exact match with the label)")
    r.add_argument("--eval-data", help="JSONL held-out prompts: greedy accuracy of the engine's and the "
                   "trainer's BF16 policy")
    r.add_argument("--eval-interval", type=int, help="held-out greedy accuracy at step 0, every N steps "
                   "and at the last step, each before that step's rollout (0: never)")
    o = p.add_argument_group("optimization")
    o.add_argument("--global-batch-size", type=int, help="samples per optimizer step, a divisor of "
                   "the rollout's samples (default: the whole rollout, one step per rollout)")
    o.add_argument("--micro-batch-size", type=int, help="samples per forward pass; gradients of the "
                   "micro-batches of one optimizer step are accumulated (default: the whole --global-batch-size)")
    o.add_argument("--lr", type=float, help="AdamW learning rate (FP32 master weights)")
    o.add_argument("--max-grad-norm", type=float, help="clip the global gradient norm to this value (Megatron's "
                   "--clip-grad)")
    o.add_argument("--advantage-estimator", choices=["grpo", "reinforce_plus_plus"], help="advantages")
    o.add_argument("--eps-clip", type=float, help="PPO clip range (low side)")
    o.add_argument("--eps-clip-high", type=float, help="PPO clip range, high side (default: --eps-clip)")
    o.add_argument("--use-kl-loss", action="store_true", help="add a KL loss against the initial policy")
    o.add_argument("--kl-loss-coef", type=float, help="weight of the KL loss")
    o.add_argument("--kl-loss-type", choices=["k1", "k2", "k3", "low_var_kl"], help="KL estimator")
    o.add_argument("--loss-agg", choices=["token-mean", "seq-mean-token-mean"],
                   help="loss aggregation over response tokens")
    c = p.add_argument_group("corrections")
    c.add_argument("--use-tis", action="store_true", help="importance-sampling correction train/rollout")
    c.add_argument("--tis-mode", choices=["truncate", "mask"], help="truncate (TIS) or mask "
                   "(IcePop/MIS)")
    c.add_argument("--tis-level", choices=["token", "sequence", "geometric"], help="ratio level")
    c.add_argument("--tis-clip", type=float, help="upper bound C (default: 2.0 truncate, 5.0 mask)")
    c.add_argument("--tis-clip-low", type=float, help="lower bound c (default: 0 truncate, 0.5 mask)")
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
                   "bit (gap exactly 0.0): BF16 on both sides or mode 2, on a CPU or a GPU with Triton; refused for mode 1 "
                   "and an FP8 KV cache")
    w = p.add_argument_group("weight update check")
    w.add_argument("--check-weight-update-equal", action="store_true", help="before training, check that the first "
                   "weight update reproduces every engine tensor")
    w.add_argument("--check-weight-update-allow-quant-error", action="store_true", help="compare dequantized values "
                   "within one ULP per side instead of bitwise")
    out = p.add_argument_group("output")
    out.add_argument("--metrics-file", help="JSONL file, one line per step")
    out.add_argument("--tensorboard-dir", help="also write the scalars for TensorBoard (needs the "
                     "tensorboard package)")
    out.add_argument("--save", help="directory for resumable state (model, optimizer, RNG, step)")
    out.add_argument("--save-interval", type=int, help="save every N steps and at the end (0: never)")
    out.add_argument("--save-hf", help="at the end, export the trained policy as an HF BF16 checkpoint "
                     "(loads in transformers and `quantroll convert`)")
    out.add_argument("--load", help="resume from a --save directory; the metrics file continues")
    out.add_argument("--force", action="store_true", help="start over: replace the run that --save, "
                     "--metrics-file and --save-hf hold (without it, a fresh run refuses them: resume with --load). "
                     "Like every command's --force: " + FORCE_HELP)
    pl = p.add_argument_group("placement across processes (Ray; Miles' flag names)", "Give any of these to start "
                              "the ranks as Ray actors (pip install -e '.[ray]'); without them, torchrun "
                              "--nproc-per-node N -m quantroll train ... starts them, colocated, or with "
                              "--rollout-num-gpus R engines on the last R ranks (see docs/scale-out.md)")
    pl.add_argument("--actor-num-nodes", type=int, default=None, help="nodes of trainer ranks (default 1)")
    pl.add_argument("--actor-num-gpus-per-node", type=int, default=None, help="trainer ranks per node, one GPU each "
                    "(on --device cpu: one process each; default 1)")
    pl.add_argument("--rollout-num-gpus", type=int, default=None, help="GPUs of the engines, one engine each: without "
                    "--colocate, GPUs of their own (ranks after the trainer's); with --colocate the trainer's GPUs "
                    "(default: that many)")
    pl.add_argument("--colocate", action="store_true", help="trainer ranks and engines share GPUs: each rank holds "
                    "one trainer shard and one engine, which releases its KV cache while the trainer steps")
    defaults = {k: v for k, v in flag_defaults().items() if k not in NOT_FLAGS and k != "device"}
    defaults["skip"] = list(defaults["skip"])  # argparse's "extend" appends to a list
    p.set_defaults(func=run, **defaults)  # every default from the dataclasses (rl/config.py); device: above


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    if args.config:
        return _from_file(args)
    if args.fp8_recipe and args.fp4_recipe:
        raise QuantrollError(f"--fp8-recipe {args.fp8_recipe} and --fp4-recipe {args.fp4_recipe} both given; the "
                             "trainer runs one recipe, pick one")
    recipe = format_for_recipe("--fp8-recipe", args.fp8_recipe) or format_for_recipe("--fp4-recipe", args.fp4_recipe)
    flags = {k: v for k, v in vars(args).items() if k in FLAGS}
    return TrainConfig.of(**flags, train_recipe=recipe)


def _from_file(args: argparse.Namespace) -> TrainConfig:
    """``--config FILE``: the whole TrainConfig; a setting flag beside it is refused (which of
    the two would win is not something to guess)."""
    from quantroll.inputs import read_text

    defaults = {**flag_defaults(), "device": DEFAULT_DEVICE, "skip": [], "fp8_recipe": None, "fp4_recipe": None}
    given = [k for k, v in vars(args).items() if k in defaults and k not in NOT_FLAGS and v != defaults[k]]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise QuantrollError(f"--config {args.config} holds the whole configuration; drop {flags} or edit the file")
    return TrainConfig.from_json(read_text(args.config, "--config"), f"--config {args.config}")


def ray_placement(args: argparse.Namespace):
    """The Ray placement the flags ask for, or None (no placement flag given)."""
    flags = (args.actor_num_nodes, args.actor_num_gpus_per_node, args.rollout_num_gpus)
    if all(f is None for f in flags) and not args.colocate:
        return None
    from quantroll.distributed.ray_launch import RayPlacement

    return RayPlacement(args.actor_num_nodes or 1, args.actor_num_gpus_per_node or 1, args.rollout_num_gpus,
                        args.colocate)


def torchrun_engine_ranks(args: argparse.Namespace) -> int:
    """Inside a torchrun rank: how many of the last ranks hold an engine only
    (--rollout-num-gpus; 0: colocated). torchrun's --nproc-per-node sets the ranks, so the
    trainer's placement flags have no place there."""
    given = [f for f, v in (("--actor-num-nodes", args.actor_num_nodes),
                            ("--actor-num-gpus-per-node", args.actor_num_gpus_per_node),
                            ("--colocate", args.colocate or None)) if v is not None]
    if given:
        raise QuantrollError(f"{'/'.join(given)} given inside a torchrun rank, where --nproc-per-node sets the ranks "
                             "(colocated by default); drop it, or start quantroll without torchrun to place the ranks "
                             "with Ray")
    if args.rollout_num_gpus is not None and args.rollout_num_gpus < 1:
        raise QuantrollError(f"--rollout-num-gpus must be >= 1 (the last N of torchrun's ranks hold the engines), got "
                             f"{args.rollout_num_gpus}; leave it out for colocated ranks")
    return args.rollout_num_gpus or 0


def _resume_hint(save: str | None) -> str:
    """Which step an interrupted run keeps in --save and how to go on (the one line said only
    'interrupted'); nothing when there is no saved state, or it cannot be read."""
    if not save:
        return ""
    from quantroll.rl import savedir

    try:
        saved = savedir.latest(save)
    except Exception:  # a damaged or half-made directory: the next run says what is wrong with it
        return ""
    return f"; step {saved.step} is saved in {save}: continue with the same command and --load {save}" if saved else ""


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KeyboardInterrupt:
        import signal

        try:  # a second Ctrl-C while the pointer is read must not become a traceback
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread: signals are not ours to set
            previous = None
        try:
            hint = _resume_hint(args.save)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        raise Interrupted(hint) from None


def _run(args: argparse.Namespace) -> int:
    import functools

    from quantroll.rl.loop import run_training

    cfg = config_from_args(args)
    if "WORLD_SIZE" in os.environ:  # a rank started by torchrun
        history = run_training(cfg, engine_ranks=torchrun_engine_ranks(args))
    elif (placement := ray_placement(args)) is not None:
        from quantroll.distributed.ray_launch import import_ray, launch

        import_ray()  # refused before any work when Ray is missing
        history = launch(functools.partial(run_training, cfg, engine_ranks=placement.engine_ranks), placement,
                         cfg.models.device)
    else:
        history = run_training(cfg)
    if os.environ.get("RANK", "0") != "0":  # a rank of a multi-process run: rank 0 says it
        return 0
    last = history[-1]
    print(f"{len(history)} steps; last reward {last['reward_mean']:.3f}, "
          f"gap |logp diff| {last['train_rollout_logprob_abs_diff']:.3e}, rollout {last['rollout_precision']}")
    return 0
