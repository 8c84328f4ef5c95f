"""``quantroll sft``: make the built-in default model (a tiny Qwen3 warm-started on a task).

Writes a random tiny Qwen3 from a seed, trains it with supervised fine-tuning on a
built-in task until it answers some held-out problems right, and saves it as an HF
BF16 checkpoint (with its character tokenizer) that ``quantroll train``, ``convert``
and transformers load. Prints greedy accuracy on held-out problems before and after.
"""

from __future__ import annotations

import argparse

import torch

from quantroll.builtin import TINY_QWEN3_MOE
from quantroll.commands.helpformat import HelpFormatter
from quantroll.compute import COMPUTE_DTYPE_HELP, COMPUTE_DTYPES
from quantroll.errors import QuantrollError
from quantroll.outputs import FORCE_HELP, check_output_dir, check_replace
from quantroll.tasks.arithmetic import ArithmeticTask, CountTask
from quantroll.sft import (DEFAULT_BATCH_SIZE, DEFAULT_CHECK_EVERY, DEFAULT_EVAL_SIZE, DEFAULT_LR,
                                   DEFAULT_SEED, DEFAULT_STEPS, DEFAULT_TARGET_ACCURACY, STATS_FILE, WARM_START_SHAPE,
                                   warm_start)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sft",
        help="warm-start the built-in tiny Qwen3 on a built-in task (the default model for `train`)",
        description="Write a random tiny Qwen3 (character tokenizer), train it with supervised fine-tuning on "
        "prompt + answer + EOS (loss on the answer and EOS only), measure greedy exact-match accuracy on held-out "
        f"problems before and after, and save it as an HF BF16 checkpoint (recipe and accuracies in {STATS_FILE}).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--save", required=True, metavar="DIR", help="checkpoint directory to write; required")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--moe", action="store_true", help="warm-start the MoE variant (Qwen3-MoE: 8 experts, top-2) "
                   "instead of the dense tiny Qwen3")
    p.add_argument("--task", choices=("arithmetic", "count"), default="arithmetic",
                   help="built-in task: arithmetic ('a+b=' / 'a-b=') or count ('count 17 to 32:') (default: arithmetic)")
    p.add_argument("--digits", type=int, default=2, help="arithmetic: digits per operand (default: 2)")
    p.add_argument("--ops", default="+-", help="arithmetic: operators to sample from, of + - * (default: +-)")
    p.add_argument("--span", type=int, default=CountTask().span, help=f"count: numbers per answer (default: {CountTask().span})")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"optimizer steps (default: {DEFAULT_STEPS})")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help=f"problems per step (default: {DEFAULT_BATCH_SIZE})")
    p.add_argument("--lr", type=float, default=DEFAULT_LR,
                   help=f"peak learning rate of AdamW; linear warmup, cosine decay to 10%% (default: {DEFAULT_LR:g})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"seed of the random init, the training problems and the held-out set (default: {DEFAULT_SEED})")
    p.add_argument("--target-accuracy", type=float, default=DEFAULT_TARGET_ACCURACY,
                   help="stop before --steps once exact-match accuracy on held-out validation problems (checked every "
                   f"{DEFAULT_CHECK_EVERY} steps) reaches this, so the model is right often but not always and RL "
                   f"still has something to learn; 1 trains all --steps (default: {DEFAULT_TARGET_ACCURACY})")
    p.add_argument("--eval-size", type=int, default=DEFAULT_EVAL_SIZE,
                   help=f"held-out problems for the accuracy before/after (default: {DEFAULT_EVAL_SIZE})")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="device to train on (default: cuda if available, else cpu)")
    p.add_argument("--compute-dtype", default="auto", choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.task == "arithmetic":
        if args.digits < 1:
            raise QuantrollError(f"--digits must be >= 1, got {args.digits}")
        if not args.ops or set(args.ops) - set("+-*"):
            raise QuantrollError(f"--ops must be made of + - *, got {args.ops!r}")
        task = ArithmeticTask(digits=args.digits, ops=args.ops)
    else:
        if args.span < 1:
            raise QuantrollError(f"--span must be >= 1, got {args.span}")
        task = CountTask(span=args.span)
    if not 0 < args.target_accuracy <= 1:
        raise QuantrollError(f"--target-accuracy must be in (0, 1], got {args.target_accuracy}")
    if args.eval_size < 1:
        raise QuantrollError(f"--eval-size must be >= 1, got {args.eval_size}")
    _check_memory(args, task)
    check_output_dir("--save", args.save)
    check_replace(f"--save {args.save}", args.save, args.force)  # before training, not after it
    print(f"sft: {task} for up to {args.steps} steps of {args.batch_size}, lr {args.lr:g}, seed {args.seed} on {args.device}")
    stats = warm_start(args.save, task, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                       eval_size=args.eval_size, target_accuracy=args.target_accuracy, device=args.device,
                       compute_dtype=args.compute_dtype, force=args.force, what=f"--save {args.save}",
                       shape=TINY_QWEN3_MOE if args.moe else WARM_START_SHAPE)
    n = stats["eval_size"]
    stopped = "" if stats["steps_run"] == stats["steps"] else f" (validation accuracy reached {args.target_accuracy:g})"
    print(f"ran {stats['steps_run']} of {stats['steps']} steps{stopped}; "
          f"loss {stats['loss_first']:.3f} -> {stats['loss_last']:.3f}; trained in {stats['train_seconds']:.0f} s "
          f"({stats['total_seconds']:.0f} s in all)")
    print(f"greedy accuracy on {n} held-out problems: before {stats['accuracy_before']:.1%} -> "
          f"after {stats['accuracy_after']:.1%}")
    print(f"saved {args.save}")
    return 0


def _check_memory(args: argparse.Namespace, task) -> None:
    """--batch-size and --eval-size have no bound of their own: refuse what cannot fit, with
    a lower-bound estimate (rl/memory.py's rule): one batch's float32 logits over the
    character vocabulary at the shortest example length (prompt, one answer character, EOS),
    and ~200 bytes per held-out problem."""
    from quantroll.rl.memory import GIB, check_need
    from quantroll.sft import DEFAULT_VAL_SIZE
    from quantroll.tasks.tokenizer import char_vocab

    tokens = 2 * args.digits + 2 + 2 if args.task == "arithmetic" else 2 * args.span
    est = {"logits": args.batch_size * tokens * len(char_vocab()) * 4 / GIB,
           "problems": (args.eval_size + DEFAULT_VAL_SIZE) * 200 / GIB}
    check_need(est, args.device, "--batch-size, --eval-size or --digits/--span", device_parts=("logits",))
