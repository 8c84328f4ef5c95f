"""``quantroll sft``: make the built-in default model (a tiny Qwen3 warm-started on a task).

Writes a random tiny Qwen3 from a seed, trains it with supervised fine-tuning on a
built-in task until it answers some held-out problems right, and saves it as an HF
BF16 checkpoint (with its character tokenizer) that ``quantroll train``, ``convert``
and transformers load. Prints greedy accuracy on held-out problems before and after.

With ``--tokens-per-batch`` it trains any shape at long context instead (quantroll/longsft/):
token-sized steps with accumulation, state in ``--state-dir`` for ``--resume``, and a stop
rule on the sampled pass rate; e.g. the long-trace study's model::

    quantroll sft --task fib --trace-len 4096 --shape long --tokens-per-batch 65536 \
        --state-dir runs/fib-4k.state --save runs/fib-4k --device cuda
"""

from __future__ import annotations

import argparse
import time

import torch

from quantroll.builtin import TINY_QWEN3_MOE
from quantroll.commands.helpformat import HelpFormatter
from quantroll.compute import COMPUTE_DTYPE_HELP, COMPUTE_DTYPES
from quantroll.errors import QuantrollError
from quantroll.outputs import FORCE_HELP, check_output_dir, check_replace
from quantroll.tasks.arithmetic import ArithmeticTask, CountTask
from quantroll.tasks.trace import FibTraceTask
from quantroll.tasks.trace_mix import FibTraceMix
from quantroll.longsft.run import LongSFTConfig, long_sft
from quantroll.longsft.shapes import SHAPES, parameter_count, parse_shape
from quantroll.sft import (DEFAULT_BATCH_SIZE, DEFAULT_CHECK_EVERY, DEFAULT_EVAL_SIZE, DEFAULT_LR,
                                   DEFAULT_SEED, DEFAULT_STEPS, DEFAULT_TARGET_ACCURACY, STATS_FILE, WARM_START_SHAPE,
                                   warm_start)


TIME_LIMIT_EXIT = 3  # the exit status of a run stopped by --time-limit, to be resumed
# the task settings' defaults (one place: the parser's defaults, and what _refuse_other_task_flags compares with)
_PARSER_DEFAULTS = {"digits": 2, "ops": "+-", "span": CountTask().span, "trace_len": (FibTraceTask().length,),
                    "trace_terms": FibTraceTask().terms}


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
    p.add_argument("--task", choices=("arithmetic", "count", "fib"), default="arithmetic",
                   help="built-in task: arithmetic ('a+b=' / 'a-b='), count ('count 17 to 32:') or fib (a long scratchpad "
                   "of Fibonacci lines, length set by --trace-len) (default: arithmetic)")
    p.add_argument("--digits", type=int, default=_PARSER_DEFAULTS["digits"], help="arithmetic: digits per operand (default: 2)")
    p.add_argument("--ops", default=_PARSER_DEFAULTS["ops"], help="arithmetic: operators to sample from, of + - * (default: +-)")
    p.add_argument("--span", type=int, default=_PARSER_DEFAULTS["span"], help=f"count: numbers per answer (default: {CountTask().span})")
    p.add_argument("--trace-len", type=_lengths, default=_PARSER_DEFAULTS["trace_len"],
                   help="fib: target trace length in tokens; several, comma-separated (e.g. 4096,8192,16384), train "
                   f"on a mixture, each problem's length drawn uniformly (default: {FibTraceTask().length})")
    p.add_argument("--trace-terms", type=int, choices=(2, 3), default=_PARSER_DEFAULTS["trace_terms"],
                   help="fib: terms summed per line, 2 (Fibonacci) or 3 (Tribonacci, harder) (default: 2)")
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
    g = p.add_argument_group("long context (issue 42): token-sized batches, resume, a stop rule on sampled traces; "
                             "on when --tokens-per-batch is given")
    g.add_argument("--tokens-per-batch", type=int, help="tokens (prompt + answer + EOS) per optimizer step, drawn "
                   "fresh each step; turns on the long-context trainer")
    g.add_argument("--micro-batch-tokens", type=int, default=LongSFTConfig().micro_batch_tokens,
                   help="positions per forward, padding included: examples sorted by length are packed up to this and "
                   "their gradients accumulated (default: %(default)s)")
    g.add_argument("--shape", default="tiny", help=f"model shape NAME[,field=value...], NAME one of {', '.join(SHAPES)} "
                   "(long: 7.4M parameters, 20,480 positions) (default: tiny)")
    g.add_argument("--context", type=int, help="positions the model takes (max_position_embeddings; default: the shape's)")
    g.add_argument("--state-dir", metavar="DIR", help="where the run keeps its init and its training state (required "
                   "with --tokens-per-batch)")
    g.add_argument("--save-every", type=int, default=LongSFTConfig().save_every,
                   help="save the training state every N steps, atomically (default: %(default)s)")
    g.add_argument("--resume", action="store_true", help="continue the run saved in --state-dir from its last saved step")
    g.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="stop once a step ends this many seconds after the command started, save the state and exit "
                   f"with status {TIME_LIMIT_EXIT} without writing --save; rerun with --resume to continue (a job split "
                   "over calls of limited length)")
    g.add_argument("--check-every", type=int, default=LongSFTConfig().check_every,
                   help="quality check every N steps: per-token NLL and sampled pass rate per length bucket "
                   "(default: %(default)s)")
    g.add_argument("--val-size", type=int, default=LongSFTConfig().val_size,
                   help="held-out problems of the quality check (default: %(default)s)")
    g.add_argument("--target-pass-rate", type=float, default=LongSFTConfig().target_pass_rate,
                   help="stop once the sampled pass rate (temperature 1, through the engine) reaches this "
                   "(default: %(default)s)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="device to train on (default: cuda if available, else cpu)")
    p.add_argument("--compute-dtype", default="auto", choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    task = _task(args)
    if args.tokens_per_batch is not None:
        return _run_long(args, task)
    if args.resume or args.state_dir or args.context or args.shape != "tiny" or args.time_limit is not None:
        raise QuantrollError("--shape, --context, --state-dir, --resume and --time-limit belong to the long-context "
                             "trainer; add --tokens-per-batch N")
    if not 0 < args.target_accuracy <= 1:
        raise QuantrollError(f"--target-accuracy must be in (0, 1], got {args.target_accuracy}")
    if args.eval_size < 1:
        raise QuantrollError(f"--eval-size must be >= 1, got {args.eval_size}")
    shape = TINY_QWEN3_MOE if args.moe else WARM_START_SHAPE
    _check_context(args, task, shape.max_position_embeddings)
    _check_memory(args, task)
    check_output_dir("--save", args.save)
    check_replace(f"--save {args.save}", args.save, args.force)  # before training, not after it
    print(f"sft: {task} for up to {args.steps} steps of {args.batch_size}, lr {args.lr:g}, seed {args.seed} on {args.device}")
    stats = warm_start(args.save, task, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                       eval_size=args.eval_size, target_accuracy=args.target_accuracy, device=args.device,
                       compute_dtype=args.compute_dtype, force=args.force, what=f"--save {args.save}",
                       shape=shape)
    n = stats["eval_size"]
    stopped = "" if stats["steps_run"] == stats["steps"] else f" (validation accuracy reached {args.target_accuracy:g})"
    print(f"ran {stats['steps_run']} of {stats['steps']} steps{stopped}; "
          f"loss {stats['loss_first']:.3f} -> {stats['loss_last']:.3f}; trained in {stats['train_seconds']:.0f} s "
          f"({stats['total_seconds']:.0f} s in all)")
    print(f"greedy accuracy on {n} held-out problems: before {stats['accuracy_before']:.1%} -> "
          f"after {stats['accuracy_after']:.1%}")
    print(f"saved {args.save}")
    return 0


_TASK_FLAGS = (("digits", "arithmetic"), ("ops", "arithmetic"), ("span", "count"), ("trace_len", "fib"),
               ("trace_terms", "fib"))


def _refuse_other_task_flags(args: argparse.Namespace) -> None:
    """'--span 3' with arithmetic was ignored silently: a setting of another task than
    --task's, at a value other than its default, is refused."""
    for name, task in _TASK_FLAGS:
        value = getattr(args, name)
        if args.task != task and value != _PARSER_DEFAULTS[name]:
            value = ",".join(map(str, value)) if isinstance(value, tuple) else value
            raise QuantrollError(f"--{name.replace('_', '-')} {value} belongs to --task {task}, but this run trains "
                                 f"on --task {args.task}, which ignores it; drop it or give --task {task}")


def _task(args: argparse.Namespace):
    _refuse_other_task_flags(args)
    if args.task == "arithmetic":
        if args.digits < 1:
            raise QuantrollError(f"--digits must be >= 1, got {args.digits}")
        if not args.ops or set(args.ops) - set("+-*"):
            raise QuantrollError(f"--ops must be made of + - *, got {args.ops!r}")
        return ArithmeticTask(digits=args.digits, ops=args.ops)
    if args.task == "fib":
        if len(args.trace_len) > 1:
            return FibTraceMix(lengths=args.trace_len, terms=args.trace_terms)
        return FibTraceTask(length=args.trace_len[0], terms=args.trace_terms)
    if args.span < 1:
        raise QuantrollError(f"--span must be >= 1, got {args.span}")
    return CountTask(span=args.span)


def _lengths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a length or comma-separated lengths in tokens, got {text!r}") from None


def _run_long(args: argparse.Namespace, task) -> int:
    if args.moe or args.batch_size != DEFAULT_BATCH_SIZE or args.target_accuracy != DEFAULT_TARGET_ACCURACY:
        raise QuantrollError("with --tokens-per-batch, --moe, --batch-size and --target-accuracy do not apply: use "
                             "--shape tiny-moe, --tokens-per-batch and --target-pass-rate")
    if not args.state_dir:
        raise QuantrollError("--tokens-per-batch needs --state-dir DIR, where the run keeps its state for --resume")
    if args.time_limit is not None and not args.time_limit >= 0:
        raise QuantrollError(f"--time-limit must be >= 0 seconds, got {args.time_limit}")
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    shape = parse_shape(args.shape, args.context)
    check_output_dir("--save", args.save)
    check_replace(f"--save {args.save}", args.save, args.force)  # before training, not after it
    cfg = LongSFTConfig(steps=args.steps, tokens_per_batch=args.tokens_per_batch,
                        micro_batch_tokens=args.micro_batch_tokens, lr=args.lr, seed=args.seed,
                        save_every=args.save_every, check_every=args.check_every, val_size=args.val_size,
                        eval_size=args.eval_size, target_pass_rate=args.target_pass_rate)
    print(f"sft: {task} on shape {args.shape} ({parameter_count(shape) / 1e6:.2f}M parameters, "
          f"{shape.max_position_embeddings} positions) for up to {args.steps} steps of {args.tokens_per_batch} tokens, "
          f"lr {args.lr:g}, seed {args.seed} on {args.device}")
    stats = long_sft(args.save, task, shape, cfg, args.state_dir, resume=args.resume, device=args.device,
                     compute_dtype=args.compute_dtype, force=args.force, what=f"--save {args.save}", deadline=deadline)
    if stats["stopped_by"] == "time_limit":
        print(f"stopped at --time-limit after {stats['last_step'] + 1} of {args.steps} steps ({stats['steps_run']} "
              f"in this state); nothing written to --save: rerun with --resume to continue")
        return TIME_LIMIT_EXIT
    before, after = stats["greedy_before"], stats["greedy_after"]
    print(f"ran {stats['steps_run']} of {args.steps} steps (stopped by {stats['stopped_by']}); loss "
          f"{stats['losses'][0]:.3f} -> {stats['losses'][-1]:.3f}")
    print(f"greedy accuracy on {stats['eval_size']} held-out problems: "
          + (f"before {before['accuracy']:.1%} -> " if before else "") + f"after {after['accuracy']:.1%} "
          + " ".join(f"[{b}: {v['accuracy']:.0%}]" for b, v in after["by_len"].items()))
    print(f"saved {args.save}")
    return 0
def _check_context(args: argparse.Namespace, task, context: int) -> None:
    """Prompt, answer and EOS of the task's problems must fit the model's positions (and the
    greedy check's two tokens beyond the answer): refused before any work, naming the task's
    own flags (the engine's message, met only at the first evaluation, named max_new_tokens,
    which sft has no flag for)."""
    import random

    from quantroll.sft import encode

    rng = random.Random(args.seed)
    longest = max(len(encode(p.prompt)) + len(encode(p.label)) + 2 for p in (task.sample(rng) for _ in range(256)))
    if longest > context:
        flag = {"arithmetic": "--digits", "count": "--span", "fib": "--trace-len"}[args.task]
        raise QuantrollError(f"--task {args.task}: a problem with its answer takes {longest} positions but the model's "
                             f"context is {context}; lower {flag}")


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
