"""Where the decode step's time goes on its critical path: the 8B step with one kind of
small kernel left out (its first output per shape reused, so the numbers are garbage but
the launches and their data flow are those of the step without it). The step's drop is
that kernel's cost on the critical path, which per-kernel profiles (overlapping under
early launch) do not give. Variants: the silu * up (+ quantize) kernel, the residual add +
RMSNorm (+ quantize) kernels, the one-launch decode attention, and all three.

    python bench/ablate_step.py --precision fp8 --batches 16
"""
import argparse

import torch

from bench.switch_ab import run_variants


def reuse_first_output(fn, key_of):
    """fn, except that after its first call per key it returns that call's output."""
    seen = {}

    def wrapper(*args, **kw):
        key = key_of(*args, **kw)
        if key not in seen:
            seen[key] = fn(*args, **kw)
        return seen[key]
    return wrapper


def shapes(*args, **kw):
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args
                 if isinstance(a, (torch.Tensor, bool, type(None)))) + tuple(sorted(kw.items()))


def main():
    from quantroll.kernels import decode_attention, fused

    p = argparse.ArgumentParser()
    p.add_argument("--precision", default="fp8", choices=("fp8", "bf16"))
    p.add_argument("--batches", default="16")
    p.add_argument("--layers", type=int, default=None)
    args = p.parse_args()
    silu = ("quantroll.kernels.fused", "silu_mul", reuse_first_output(fused.silu_mul, shapes))
    norm = ("quantroll.kernels.fused", "add_rmsnorm", reuse_first_output(fused.add_rmsnorm, shapes))
    attn = ("quantroll.kernels.decode_attention", "decode_attention_qkv",
            reuse_first_output(decode_attention.decode_attention_qkv, lambda qkv, *a, quantize=False: (qkv.shape,
                                                                                                       quantize)))
    variants = [("shipped", []), ("no-silu", [silu]), ("no-norm", [norm]), ("no-attention", [attn]),
                ("none-of-3", [silu, norm, attn]), ("shipped-again", [])]
    approx = [name for name, _ in variants[1:-1]]
    run_variants(variants, approx, "qwen3-8b", args.layers, args.batches, precision=args.precision)


if __name__ == "__main__":
    main()
