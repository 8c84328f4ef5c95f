"""``quantroll demo``: the built-in default, end to end, in about a minute on a CPU.

Writes the built-in tiny Qwen3 (made from a seed; nothing is downloaded), converts it
to every low-precision format, prints what ``inspect`` sees against the BF16 source,
then rolls out the same prompts with the BF16 and each quantized engine and prints
the gap between the engine's logprobs and the BF16 model's on the same tokens: the
train/rollout mismatch that low-precision rollout adds, before any training.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from quantroll.builtin import write_tiny_qwen3
from quantroll.checkpoint.atomic import atomic_directory
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.checkpoint.stats import inspect_checkpoint
from quantroll.commands.helpformat import HelpFormatter
from quantroll.commands.inspect import format_report
from quantroll.compute import COMPUTE_DTYPE_HELP, COMPUTE_DTYPES, resolve_compute_dtype
from quantroll.engine import Engine, SamplingParams
from quantroll.formats import FORMAT_NAMES


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the built-in default: tiny Qwen3 -> every format -> inspect -> rollout gap",
        description="Write the built-in tiny Qwen3 checkpoint, convert it to fp8, mxfp8 and nvfp4, inspect each "
        "against the BF16 source, and measure each engine's logprob gap to the BF16 model on its own rollouts.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--workdir", default="quantroll-demo", help="where the checkpoints go, each replaced at every run "
                   "when quantroll wrote all of it (a directory there holding other files is refused) "
                   "(default: ./quantroll-demo)")
    p.add_argument("--prompts", type=int, default=8, help="number of rollout prompts (default: 8)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="response length of each rollout (default: 32)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--compute-dtype", default="auto", choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    p.set_defaults(func=run)


def logprob_gap(reference: Engine, results) -> tuple[float, float]:
    """(mean |logp_ref - logp_engine|, k3 KL) over all response tokens."""
    diffs = []
    for r in results:
        ids = torch.tensor([r.prompt_tokens + r.tokens[:-1]], device=reference.device)
        with torch.no_grad():
            logits = reference.model(ids)[0, len(r.prompt_tokens) - 1:].float()
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.tokens, device=ids.device)[:, None])[:, 0]
        diffs.append(ref.cpu() - torch.tensor(r.logprobs))
    d = torch.cat(diffs).double()
    return float(d.abs().mean()), float((d.exp() - 1 - d).mean())


def run(args: argparse.Namespace) -> int:
    from quantroll.errors import QuantrollError

    if args.prompts < 1:
        raise QuantrollError(f"--prompts must be >= 1 (the rollout prompts whose gap the demo measures), got "
                             f"{args.prompts}")
    if args.max_new_tokens < 1:
        raise QuantrollError(f"--max-new-tokens must be >= 1 (the response length), got {args.max_new_tokens}")
    from quantroll.engine.sampling import check_sampling_seed

    check_sampling_seed(args.seed)
    from quantroll.outputs import check_replace
    from quantroll.rl.memory import GIB, check_need
    from quantroll.tasks.tokenizer import char_vocab

    # the lower bound of one engine's rollout (rl/memory.py's rule): the float32 logits of every
    # prompt's response and its longest prompt (15 tokens) over the built-in vocabulary
    check_need({"logits": args.prompts * (args.max_new_tokens + 15) * len(char_vocab()) * 4 / GIB}, "cpu",
               "--prompts or --max-new-tokens")

    work = Path(args.workdir)
    bf16 = work / "tiny-qwen3-bf16"
    for name in ("bf16", *FORMAT_NAMES):  # all of them before any is written
        check_replace(f"--workdir {work}: tiny-qwen3-{name}", work / f"tiny-qwen3-{name}", force=True)
    with atomic_directory(bf16, force=True, what=f"--workdir {work}: {bf16.name}") as tmp:  # quantroll's only
        write_tiny_qwen3(tmp)
    print(f"built-in checkpoint: {bf16}")
    dirs = {"bf16": bf16}
    for name in FORMAT_NAMES:
        out = work / f"tiny-qwen3-{name}"
        convert_checkpoint(bf16, out, ConvertConfig(format=name, force=True, progress=False),
                           f"--workdir {work}: {out.name}")
        dirs[name] = out
        print(f"\n== quantroll inspect {out} --against {bf16}")
        print(format_report(inspect_checkpoint(out, bf16), top=3))

    dtype = resolve_compute_dtype("cpu", args.compute_dtype)
    reference = Engine(bf16, dtype=dtype)
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, reference.config.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 16, (args.prompts,), generator=g)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"\n== rollout gap at step 0: {args.prompts} prompts x {args.max_new_tokens} tokens, T=1, "
          "engine logprobs vs the BF16 model on the same tokens")
    print(f"{'engine':18s} {'mean |diff|':>12s} {'k3 KL':>12s}")
    for name, path in dirs.items():
        engine = reference if name == "bf16" else Engine(path, dtype=dtype)
        diff, kl = logprob_gap(reference, engine.generate(prompts, params))
        print(f"{engine.precision:18s} {diff:12.3e} {kl:12.3e}")
    return 0
