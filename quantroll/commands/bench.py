"""``quantroll bench``: measurements on the GPU (see docs/PERFORMANCE.md for results)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from quantroll.commands.helpformat import HelpFormatter
from quantroll.errors import QuantrollError
from quantroll.outputs import REPORT_RULE, write_report


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="GPU benchmarks (rollout speed)", description=__doc__,
                              formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    r = sub.add_parser("rollout", help="prefill/decode speed of BF16 and FP8 engines on real model shapes",
                       description="Rollout speed on real model shapes with random weights. --workload fixed: every "
                       "sequence of a batch generates --new-tokens tokens, per batch size. --workload rl: --prompts x "
                       "--samples sequences with long-tail response lengths (lognormal, sigma 1, mean --mean-len, "
                       "capped at --new-tokens), per weight precision x KV cache dtype, against the serial roofline. Needs a "
                       "CUDA GPU; results are recorded in docs/PERFORMANCE.md.", formatter_class=HelpFormatter)
    r.add_argument("--workload", default="fixed", choices=["fixed", "rl"], help="fixed batches, or the RL workload "
                   "(default: fixed)")
    r.add_argument("--shape", default=None, help="model shape(s), random weights, comma-separated for fixed: "
                   "qwen3-8b, qwen3-1.7b, qwen3-30b-a3b, or another family's size (an unknown name lists them) "
                   "(default: qwen3-8b,qwen3-1.7b fixed; qwen3-8b rl)")
    r.add_argument("--layers", type=int, default=None, help="use only N decoder layers (default: all)")
    r.add_argument("--batches", default=None, help="comma-separated batch sizes, for every shape (default: 8B "
                   "1,16,64,128,256,512; 1.7B 64,128,256,512; 30B-A3B 1,16,64; other shapes 8B's)")
    r.add_argument("--precisions", default="bf16,fp8", help="comma-separated engine precisions (default: bf16,fp8)")
    r.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per sequence (default: 128 fixed, "
                   "512 rl)")
    r.add_argument("--new-tokens", type=int, default=None, help="tokens generated per sequence, for rl the cap of "
                   "the drawn lengths (default: 256 fixed, 8192 rl)")
    r.add_argument("--prompts", type=int, default=64, help="rl: distinct prompts (default: 64)")
    r.add_argument("--samples", type=int, default=8, help="rl: samples per prompt, sharing its prefix (default: 8)")
    r.add_argument("--mean-len", type=int, default=2048, help="rl: mean response length (default: 2048)")
    r.add_argument("--kv-cache-dtypes", default="bf16,fp8_e4m3", help="rl: comma-separated KV cache dtypes "
                   "(default: bf16,fp8_e4m3)")
    r.add_argument("--policies", default="continuous", help="rl: comma-separated batching policies: continuous, "
                   "static (sub-batches reserving the maximum length, each run to its longest row), at the same KV "
                   "budget (default: continuous)")
    r.add_argument("--fp8-kv-attention", default="cuda", choices=["cuda", "triton"],
                   help="rl: the decode attention over an FP8 KV cache: the CUDA kernel the engine runs where it can "
                        "(kernels/paged_decode_cuda.py), or the Triton tiles, to compare (default: cuda)")
    r.add_argument("--kv-cache-memory-gb", type=float, default=None, help="rl: the KV pool (default: 85%% of the "
                   "free GPU memory)")
    r.add_argument("--repeats", type=int, default=3, help="timed repeats per point, median reported (default: 3)")
    r.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON to FILE; " + REPORT_RULE)
    r.set_defaults(func=run_rollout)


def rollout_plan(args: argparse.Namespace) -> tuple[dict[str, list[int]], list[str]]:
    """({shape: batches}, precisions) of a ``bench rollout`` call, every argument checked
    before any work (a bad --json path would otherwise surface after the whole benchmark)."""
    from quantroll.bench.rollout import DEFAULT_BATCHES, DEFAULT_SHAPES
    from quantroll.bench.shapes import SHAPES
    from quantroll.formats import FORMAT_NAMES
    from quantroll.outputs import check_report_file

    rl = args.workload == "rl"
    shapes = args.shape.split(",") if args.shape else (["qwen3-8b"] if rl else list(DEFAULT_SHAPES))
    if unknown := [s for s in shapes if s not in SHAPES]:
        raise QuantrollError(f"--shape: unknown {unknown}; choose from {', '.join(SHAPES)}")
    if rl and len(shapes) != 1:
        raise QuantrollError(f"--workload rl takes one --shape, got {args.shape!r}")
    args.shapes = shapes
    if args.batches is None:
        batches = {s: list(DEFAULT_BATCHES.get(s, DEFAULT_BATCHES["qwen3-8b"])) for s in shapes}
    else:
        try:
            given = [int(b) for b in args.batches.split(",")]
        except ValueError:
            raise QuantrollError(f"--batches takes comma-separated integers, got {args.batches!r}") from None
        if not given or min(given) < 1:
            raise QuantrollError(f"--batches must all be >= 1, got {args.batches!r}")
        batches = {s: given for s in shapes}
    precisions = args.precisions.split(",")
    known = ("bf16", *FORMAT_NAMES)
    if unknown := [p for p in precisions if p not in known]:
        raise QuantrollError(f"--precisions: unknown {unknown}; choose from {', '.join(known)}")
    for shape in shapes:
        most = SHAPES[shape].num_hidden_layers
        if args.layers is not None and not 1 <= args.layers <= most:
            raise QuantrollError(f"--layers must be in [1, {most}] for {shape}, got {args.layers}")
    if args.prompt_len is None:
        args.prompt_len = 512 if rl else 128
    if args.new_tokens is None:
        args.new_tokens = 8192 if rl else 256
    for flag, value in (("--prompt-len", args.prompt_len), ("--new-tokens", args.new_tokens),
                        ("--repeats", args.repeats), ("--prompts", args.prompts), ("--samples", args.samples),
                        ("--mean-len", args.mean_len)):
        if value < 1:
            raise QuantrollError(f"{flag} must be >= 1, got {value}")
    if rl:
        from quantroll.engine.paged_cache import kv_cache_dtype_name

        args.kv_cache_dtypes = [kv_cache_dtype_name(d) for d in args.kv_cache_dtypes.split(",")]
        if args.mean_len > args.new_tokens:
            raise QuantrollError(f"--mean-len {args.mean_len} is above the cap --new-tokens {args.new_tokens}")
        args.policies = tuple(p.strip() for p in args.policies.split(","))
        unknown = [p for p in args.policies if p not in ("continuous", "static")]
        if unknown or not args.policies:
            raise QuantrollError(f"--policies {','.join(args.policies)}: each must be continuous or static")
    if args.fp8_kv_attention != "cuda" and not (rl and "fp8_e4m3" in args.kv_cache_dtypes):
        raise QuantrollError(f"--fp8-kv-attention {args.fp8_kv_attention} changes only the RL workload's FP8 KV cache "
                             "runs: add --workload rl with fp8_e4m3 in --kv-cache-dtypes, or leave it out")
    if args.json:
        check_report_file("--json", args.json)
    return batches, precisions


def workload_kernels(fp8_kv_attention: str):
    """The engines' KernelConfig for --fp8-kv-attention: None (the engine's default) for cuda,
    else the default kernels with the FP8 cache's decode on the Triton tiles."""
    if fp8_kv_attention == "cuda":
        return None
    from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS
    from quantroll.model.kernel_config import KernelConfig

    return KernelConfig(gpu=DEFAULT_ENGINE_KERNELS.without_cuda_attention())


def run_rollout(args: argparse.Namespace) -> int:
    import torch

    batches, precisions = rollout_plan(args)
    if not torch.cuda.is_available():
        raise QuantrollError("bench rollout needs a CUDA GPU; none is visible")
    if args.workload == "rl":
        from quantroll.bench.workload import Workload, format_workload_table, run_workload

        w = Workload(args.prompts, args.samples, args.prompt_len, args.mean_len, args.new_tokens)
        peaks, results = run_workload(args.shapes[0], args.layers, w, precisions, args.kv_cache_dtypes, args.policies,
                                      args.kv_cache_memory_gb, kernels=workload_kernels(args.fp8_kv_attention))
        print(format_workload_table(peaks, w, results))
        ran = sorted({r.decode_attention for r in results if r.kv_cache_dtype != "bf16"})
        if ran:  # what the engines ran (the CUDA kernel's absence is logged with its reason)
            print(f"FP8 KV decode attention: {', '.join(ran)} (asked: {args.fp8_kv_attention})")
        if args.json:
            write_report("--json", args.json, {"peaks": asdict(peaks), "workload": asdict(w),
                                               "fp8_kv_attention": args.fp8_kv_attention,
                                               "results": [asdict(r) for r in results]})
        return 0
    from quantroll.bench.rollout import format_table, run_rollout_bench

    peaks, results = run_rollout_bench(args.shapes, args.layers, batches, precisions, args.prompt_len,
                                       args.new_tokens, args.repeats)
    print(format_table(peaks, results))
    if args.json:
        write_report("--json", args.json, {"peaks": asdict(peaks), "results": [asdict(r) for r in results]})
    return 0
