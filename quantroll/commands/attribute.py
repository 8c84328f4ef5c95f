"""``quantroll attribute``: which layers and module kinds make the train/rollout gap, and
which BF16 exceptions close it.

On a BF16 checkpoint (or a built-in model) and responses the engine samples at the
rollout precision, it measures every decoder layer's and module kind's contribution to
the gap (exact ablations: only that unit in low precision, everything but that unit;
cheap estimates beside them: hidden-state divergence, each linear's own output error,
MoE routing flips), ranks them, proposes the smallest set of cells to keep in BF16 that
brings the gap under --target-gap (or --target-fraction of it), with the weight bytes it
costs, verifies that set through convert + engine + trainer on fresh seeds, and prints it
as flags to paste into convert, train and compare. Writes report.md, attribution.json
and plots/gap_contribution.png to --output-dir (all at once or nothing).
"""

from __future__ import annotations

import argparse

import torch

from quantroll.builtin import BUILTIN_MODELS
from quantroll.commands.helpformat import HelpFormatter
from quantroll.compute import COMPUTE_DTYPE_HELP, COMPUTE_DTYPES
from quantroll.errors import QuantrollError
from quantroll.formats import FORMAT_NAMES
from quantroll.outputs import FORCE_HELP


def register(subparsers) -> None:
    p = subparsers.add_parser("attribute", help="where the gap comes from: per-layer / per-module attribution and "
                              "measured BF16 exceptions (flags for convert, train, compare)", description=__doc__,
                              formatter_class=HelpFormatter)
    m = p.add_argument_group("model and precision")
    m.add_argument("--hf-checkpoint", default=None, help="BF16 HF checkpoint (default: the built-in warm-started "
                   "tiny Qwen3, see --builtin-model)")
    m.add_argument("--builtin-model", default="dense", choices=sorted(BUILTIN_MODELS), help="built-in model when "
                   "--hf-checkpoint is not given")
    m.add_argument("--precision", default="fp8", choices=FORMAT_NAMES, help="the rollout precision to attribute")
    m.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device")
    m.add_argument("--compute-dtype", default="auto", choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    d = p.add_argument_group("responses")
    d.add_argument("--task", default="arithmetic", choices=["arithmetic", "count"], help="built-in task")
    d.add_argument("--digits", type=int, default=2, help="arithmetic: digits per operand")
    d.add_argument("--prompt-data", default=None, help="JSONL prompts instead of the built-in task")
    d.add_argument("--input-key", default="prompt", help="JSONL key of the prompt text")
    d.add_argument("--label-key", default="label", help="JSONL key of the label")
    d.add_argument("--prompts", type=int, default=32, help="prompts per seed")
    d.add_argument("--samples", type=int, default=4, help="responses sampled per prompt")
    d.add_argument("--max-new-tokens", type=int, default=8, help="response length limit")
    d.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (and of the logprobs)")
    d.add_argument("--seeds", default="1,2,3", help="seeds of the measured batches (spread over seeds)")
    d.add_argument("--verify-seeds", default="101,102,103", help="fresh seeds on which the proposal is verified "
                   "through convert + engine + trainer ('none': skip)")
    t = p.add_argument_group("proposal")
    target = t.add_mutually_exclusive_group()
    target.add_argument("--target-gap", type=float, default=None, help="bring the gap under this value")
    target.add_argument("--target-fraction", type=float, default=0.5, help="bring the gap under this fraction of "
                        "the gap with every linear low precision")
    t.add_argument("--cheap-only", action="store_true", help="cheap estimates only (one forward per precision "
                   "and seed): no ablations, no proposal")
    o = p.add_argument_group("output")
    o.add_argument("--output-dir", default="quantroll-attribution", help="report.md, attribution.json, plots/")
    o.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func=run)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        values = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise QuantrollError(f"{flag} {text!r}: use a comma-separated list of integers") from None
    if any(v < 0 for v in values):
        raise QuantrollError(f"{flag} {text!r}: seeds must be >= 0")
    if not values:  # '' skipped the verification silently; 'none' is the way to ask for that
        raise QuantrollError(f"{flag} is empty; give e.g. 1,2,3" + (", or 'none' to skip the verification"
                                                                     if flag == "--verify-seeds" else ""))
    return values


def config_from_args(args: argparse.Namespace):
    from quantroll.attribution.run import AttributeConfig

    seeds = _ints(args.seeds, "--seeds")
    return AttributeConfig(
        hf_checkpoint=args.hf_checkpoint, builtin_model=args.builtin_model, precision=args.precision, task=args.task,
        digits=args.digits, prompt_data=args.prompt_data, input_key=args.input_key, label_key=args.label_key,
        prompts=args.prompts, samples=args.samples, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        seeds=seeds, verify_seeds=_ints(args.verify_seeds, "--verify-seeds"), target_gap=args.target_gap,
        target_fraction=args.target_fraction, cheap_only=args.cheap_only, device=args.device,
        compute_dtype=args.compute_dtype)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from quantroll.attribution.report import format_report, write_outputs
    from quantroll.attribution.run import run_attribution
    from quantroll.checkpoint.atomic import atomic_directory
    from quantroll.durable import writing
    from quantroll.outputs import check_output_dir, check_replace

    cfg = config_from_args(args)
    out = Path(args.output_dir)
    what = f"--output-dir {out}"
    check_output_dir("--output-dir", args.output_dir)
    check_replace(what, out, args.force)  # before the work, and again when the output is moved into place
    _check_memory(cfg)
    result = run_attribution(cfg)
    print()
    print(format_report(result), end="")
    with writing(what), atomic_directory(out, force=args.force, what=what) as tmp:
        write_outputs(result, tmp)
    print(f"\nreport: {out / 'report.md'}")
    unreachable = (result.get("proposal") or {}).get("unreachable")
    if unreachable:  # the report is written (exit 1, not 2: work was done); no proposal reaches the target
        err = QuantrollError(unreachable)
        err.exit_code = 1
        raise err
    return 0


def _check_memory(cfg) -> None:
    """--prompts, --samples and --max-new-tokens have no bound of their own: refuse what
    cannot fit (rl/memory.py's rule), with the lower bound of one seed's batch: the
    float32 logits of every sampled sequence (response and one prompt token) over the
    vocabulary, and two models' weights (2 bytes a parameter each)."""
    import math

    from quantroll.attribution.run import source_of
    from quantroll.checkpoint.reader import CheckpointReader
    from quantroll.model.config import load_model_config
    from quantroll.rl.memory import GIB, check_need

    source, _ = source_of(cfg)
    if not (source / "config.json").is_file():
        return  # refused by its reader, in its own words
    with CheckpointReader(source) as reader:
        params = sum(math.prod(i.shape) for i in reader.tensors.values())
    sequences = cfg.prompts * cfg.samples
    est = {"weights": 2 * 2 * params / GIB,
           "logits": sequences * (cfg.max_new_tokens + 1) * load_model_config(source).vocab_size * 4 / GIB}
    check_need(est, cfg.device, "--prompts, --samples or --max-new-tokens", device_parts=("weights", "logits"))
