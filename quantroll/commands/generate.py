"""``quantroll generate``: a quick look at what an engine produces from a checkpoint.

Tokenizes the prompt with the checkpoint's own ``tokenizer.json``, generates, and
prints the text with the mean logprob and the finish reason of each sample. The
prompt is used as raw text (no chat template is applied). BF16 weights compute by the
rule every command shares (--compute-dtype, quantroll/compute.py), so greedy output here
is what the RL loop's engine and trainer produce on the same machine.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from quantroll.commands.helpformat import HelpFormatter
from quantroll.compute import COMPUTE_DTYPE_HELP, COMPUTE_DTYPES, resolve_compute_dtype
from quantroll.engine import Engine, SamplingParams
from quantroll.engine.scheduler import SchedulerConfig
from quantroll.engine.sampling import check_sampling_seed
from quantroll.errors import QuantrollError
from quantroll.tasks.tokenizer import first_unknown, load_tokenizer


SAMPLES_PER_ROUND = SchedulerConfig().max_num_seqs  # one round fills the engine's running set

def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text from a checkpoint (BF16 or quantized) with the engine",
                              description="Generate from --hf-checkpoint with quantroll's engine and print each sample.",
                              formatter_class=HelpFormatter)
    p.add_argument("--hf-checkpoint", required=True, metavar="DIR",
                   help="checkpoint the engine loads (BF16 or `quantroll convert` output); required")
    p.add_argument("--prompt", required=True, help="prompt text, tokenized with DIR/tokenizer.json; required")
    p.add_argument("--n", type=int, default=1, help="number of samples (default: 1)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per sample (default: 64)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, 0 for greedy (default: 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0, off)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (default: 0, off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed; sample i uses seed + i (default: 0)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="device to run on (default: cuda if available, else cpu)")
    p.add_argument("--compute-dtype", default="auto", choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    checkpoint = Path(args.hf_checkpoint)
    if not checkpoint.is_dir():
        raise QuantrollError(f"--hf-checkpoint {checkpoint}: no such directory")
    if args.n < 1:
        raise QuantrollError(f"--n must be >= 1, got {args.n}")
    check_sampling_seed(args.seed)
    tokenizer = load_tokenizer(checkpoint)
    bad = first_unknown(tokenizer, args.prompt)  # train refuses such data; here it was generated from silently
    if bad is not None:
        code = " ".join(f"U+{ord(c):04X}" for c in bad[:4])
        raise QuantrollError(f"--prompt holds {bad!r} ({code}), which the checkpoint's tokenizer has no token for "
                             "(it would silently become its unknown token); remove or replace that character")
    ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
    engine = Engine(checkpoint, device=args.device, dtype=resolve_compute_dtype(args.device, args.compute_dtype))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"engine: {engine.precision} on {engine.device}; prompt: {len(ids)} tokens")
    # in rounds of at most SAMPLES_PER_ROUND, each printed when done: a large --n shows its
    # progress and holds one round's results at a time; sample i keeps its seed (seed + i)
    for first in range(0, args.n, SAMPLES_PER_ROUND):
        count = min(SAMPLES_PER_ROUND, args.n - first)
        results = engine.generate([ids] * count, dataclasses.replace(params, seed=args.seed + first))
        for i, res in enumerate(results, start=first):
            mean_lp = sum(res.logprobs) / len(res.logprobs)
            print(f"--- sample {i}: {len(res.tokens)} tokens, finish={res.finish_reason}, mean logprob {mean_lp:.3f}")
            print(args.prompt + tokenizer.decode(res.tokens), flush=True)
    return 0
