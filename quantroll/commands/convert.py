"""``quantroll convert``: a BF16 HF checkpoint -> a block-FP8 / MXFP8 / NVFP4 checkpoint.

The output is what the rollout engine loads (mode 1's ``--hf-checkpoint``); the
trainer keeps loading the BF16 source. Everything happens in
quantroll.checkpoint.convert_checkpoint; this module only maps flags to its config.
"""

from __future__ import annotations

import argparse
import sys

from quantroll.checkpoint import ConvertConfig, convert_checkpoint
from quantroll.checkpoint.plan import REASONS
from quantroll.commands.helpformat import HelpFormatter
from quantroll.formats import FORMAT_NAMES, SCALE_RULES
from quantroll.outputs import FORCE_HELP


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert",
        help="quantize a BF16 Hugging Face checkpoint to fp8 / mxfp8 / nvfp4",
        description=(
            "Quantize the 2-D linear weights of a BF16 Hugging Face checkpoint (safetensors) and write a "
            "checkpoint vLLM, SGLang, transformers and quantroll load. Embeddings, lm_head, norms, MoE router "
            "gates, --skip matches, the first/last N layers and weights whose dims are not multiples of the "
            "format's block stay in BF16 and are listed in the config; fused siblings (q/k/v, gate/up, one "
            "layer's experts) always share one precision. The output appears only when complete."
        ),
        formatter_class=HelpFormatter,
    )
    io = p.add_argument_group("input and output")
    io.add_argument("--model-dir", required=True, metavar="SRC", help="BF16 Hugging Face checkpoint directory to read (required)")
    io.add_argument(
        "--save-dir", required=True, metavar="DST", help="directory to write the quantized checkpoint to (required; "
        "new or empty, or see --force); it appears only when complete"
    )
    io.add_argument("--force", action="store_true", help=FORCE_HELP)
    fmt = p.add_argument_group("format")
    fmt.add_argument(
        "--format",
        required=True,
        metavar="{" + ",".join(FORMAT_NAMES) + "}",
        help="fp8: E4M3 with float32 scales per 128x128 block (DeepSeek-V3/Qwen3-FP8 layout); mxfp8: E4M3 with an "
        "E8M0 scale per 1x32 group; nvfp4: E2M1 with an E4M3 scale per 1x16 group and a float32 scale per tensor "
        "(ModelOpt layout). Required",
    )
    fmt.add_argument(
        "--scale-rule",
        choices=SCALE_RULES,
        default=None,
        help="mxfp8 only: ceil rounds each scale up so nothing saturates (Transformer Engine, Miles, SGLang); "
        "ocp is the OCP spec's floor(log2 amax) - 8, which may saturate the largest elements. Recorded in the "
        "config so weight updates re-quantize the same way. Default: ceil",
    )
    keep = p.add_argument_group("what stays in BF16")
    keep.add_argument(
        "--skip",
        nargs="+",
        action="extend",
        default=[],
        metavar="PATTERN",
        help="keep matching modules in BF16; shell-style patterns ('*' crosses dots) tested against the module "
        "name and each dot-suffix of it, e.g. 'mlp.down_proj', 'model.layers.3.*', '*.experts.*'. Repeatable. Default: none",
    )
    keep.add_argument(
        "--num-layers-at-start-in-bf16", type=int, default=0, metavar="N", help="keep the first N decoder layers in BF16 (default: 0)"
    )
    keep.add_argument(
        "--num-layers-at-end-in-bf16", type=int, default=0, metavar="N", help="keep the last N decoder layers in BF16 (default: 0)"
    )
    keep.add_argument(
        "--allow-partial-blocks",
        action="store_true",
        help="also quantize weights whose dims are not multiples of the block, using partial edge blocks; "
        "quantroll reads them, but transformers mis-reads such FP8 blocks and vLLM's fused layers refuse them. "
        "Default: keep such weights in BF16",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = ConvertConfig(
        format=args.format,
        scale_rule=args.scale_rule,
        skip=tuple(args.skip),
        num_layers_at_start_in_bf16=args.num_layers_at_start_in_bf16,
        num_layers_at_end_in_bf16=args.num_layers_at_end_in_bf16,
        allow_partial_blocks=args.allow_partial_blocks,
        force=args.force,
    )
    result = convert_checkpoint(args.model_dir, args.save_dir, cfg)
    kept = result.plan.kept()
    reasons: dict[str, int] = {}
    for d in kept.values():
        reasons[d.reason] = reasons.get(d.reason, 0) + 1
    print(
        f"wrote {result.save_dir} ({args.format}): {len(result.plan.quantized())} weights quantized, "
        f"{len(kept)} kept in source precision; {result.bytes_in / 2**20:.1f} MiB -> {result.bytes_out / 2**20:.1f} MiB"
    )
    for reason, n in sorted(reasons.items()):
        print(f"  kept {n:4d}  {reason}: {REASONS[reason]}")
    sys.stdout.flush()
    return 0
