"""Which producers should release the early-launched CUDA decode GEMM at their start
(fp8_gemv.RELEASING_PRODUCERS): the 8B FP8 decode step with each producer left out in
turn, with none releasing, and with the GEMM launched plainly, against the shipped set,
alternating with a second shipped run (bench/switch_ab.py's machinery: tokens and
logprobs must equal the shipped ones, since releasing changes no arithmetic).

    python bench/release_ab.py --batches 1,16,64 [--rounds 2]
"""
import argparse

from bench.switch_ab import run_variants

GEMV = "quantroll.kernels.fp8_gemv"
ALL = ("norm", "attention", "silu")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    sets = {f"no-{left_out}": tuple(x for x in ALL if x != left_out) for left_out in ALL}
    sets["none"] = ()
    variants = []
    for r in range(args.rounds):
        variants.append((f"shipped{r}", []))
        variants += [(f"{name}{r}", [(GEMV, "RELEASING_PRODUCERS", frozenset(value))]) for name, value in sets.items()]
        variants.append((f"plain{r}", [(GEMV, "EARLY_LAUNCH", False)]))
    run_variants(variants, [], "qwen3-8b", args.layers, args.batches)


if __name__ == "__main__":
    main()
