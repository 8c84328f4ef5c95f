"""Write a random-weight BF16 HF checkpoint of a real Qwen3 shape (nothing downloaded),
with quantroll's character tokenizer, for GPU runs of `quantroll train` / `compare`
that measure time and mismatch at real sizes.

    python bench/write_shape_checkpoint.py --shape qwen3-1.7b --out /tmp/qwen3-1.7b [--layers N]
"""

from __future__ import annotations

import argparse
import time

from quantroll.bench.shapes import SHAPES, shape_config
from quantroll.builtin import TinyQwen3, write_tiny_qwen3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-1.7b", choices=[s for s, c in SHAPES.items() if c.model_type == "qwen3"])
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the real model")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = shape_config(args.shape, args.layers)
    shape = TinyQwen3(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                      num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                      num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                      max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
                      rope_theta=cfg.rope.theta, tie_word_embeddings=cfg.tie_word_embeddings)
    t = time.perf_counter()
    write_tiny_qwen3(args.out, shape, args.seed)
    print(f"wrote {args.shape} ({cfg.num_hidden_layers} layers) to {args.out} in {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
