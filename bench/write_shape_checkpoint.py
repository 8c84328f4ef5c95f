"""Write a random-weight BF16 HF checkpoint of a real dense shape of any family (Qwen3,
Llama 3.x, Qwen2.5; nothing downloaded),
with quantroll's character tokenizer, for GPU runs of `quantroll train` / `compare`
that measure time and mismatch at real sizes.

    python bench/write_shape_checkpoint.py --shape qwen3-1.7b --out /tmp/qwen3-1.7b [--layers N]
"""

from __future__ import annotations

import argparse
import time

from quantroll.bench.shapes import SHAPES, shape_config, write_shape_checkpoint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-1.7b", choices=[s for s, c in SHAPES.items() if not c.num_experts])
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the real model")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    t = time.perf_counter()
    write_shape_checkpoint(args.shape, args.out, args.layers, args.seed)
    layers = shape_config(args.shape, args.layers).num_hidden_layers
    print(f"wrote {args.shape} ({layers} layers) to {args.out} in {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
