"""True on-policy mode on the GPU: is the gap exactly zero, and what does the mode cost?

On a random-weight checkpoint of a real shape (default: Qwen3-1.7B, written to /tmp), for
the ordinary kernels and the batch-invariant ones (model/kernel_config.INVARIANT_KERNELS):
correctness first (with the invariant kernels, how many response tokens' engine logprobs
differ from the trainer's recomputation: must be 0), then rollout tokens/s (P prompts x n
samples x R new tokens, after a warm-up call) and the time of one training step
(rl/step.train_on_batch on that rollout: old logprobs, then the update; median of a few).
The issue's ceiling: rollout >= 0.5x and train step <= 1.5x the ordinary kernels'.

    python bench/true_on_policy_gpu.py [--checkpoint DIR] [--prompts 16 --samples 8 --new-tokens 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from quantroll.bench.shapes import write_shape_checkpoint
from quantroll.engine import CacheConfig, Engine, SamplingParams
from quantroll.model.kernel_config import DEFAULT_KERNELS, INVARIANT_KERNELS
from quantroll.rl.config import TrainConfig
from quantroll.rl.rollout import RolloutBatch
from quantroll.rl.step import train_on_batch
from quantroll.trainer.optimizer import MasterWeightAdamW
from quantroll.trainer.policy import load_policy, response_logprobs


def shape_checkpoint(shape: str, out: Path) -> Path:
    if not (out / "config.json").is_file():
        write_shape_checkpoint(shape, out)
    return out


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(ckpt: Path, kernels, args) -> dict:
    engine = Engine(ckpt, device=args.device, kernels=kernels, cache=CacheConfig(memory_gb=args.kv_gb))
    gen = torch.Generator().manual_seed(0)
    distinct = [torch.randint(0, engine.config.vocab_size, (args.prompt_len,), generator=gen).tolist()
                for _ in range(args.prompts)]
    prompts = [p for p in distinct for _ in range(args.samples)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=1, stop_token_ids=())
    engine.generate(prompts[: args.samples], SamplingParams(temperature=1.0, max_new_tokens=8, seed=0,
                                                            stop_token_ids=()))
    _sync()
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    _sync()
    rollout_s = time.perf_counter() - start
    tokens = sum(len(r.tokens) for r in results)
    del engine
    policy = load_policy(ckpt, device=args.device, kernels=kernels)
    unequal = None
    if kernels.batch_invariant:
        with torch.no_grad():
            logp, _ = response_logprobs(policy, [r.prompt_tokens for r in results], [r.tokens for r in results], 1.0)
        unequal = sum(int((logp[i, :len(r.logprobs)].cpu() != torch.tensor(r.logprobs)).sum())
                      for i, r in enumerate(results))
    optimizer = MasterWeightAdamW(policy.parameters(), lr=1e-7)
    cfg = TrainConfig.of(rollout_batch_size=args.prompts, n_samples_per_prompt=args.samples, lr=1e-7,
                         micro_batch_size=args.micro_batch_size)
    rewards = torch.tensor([float(i % 2) for i in range(len(results))])
    batch = RolloutBatch(prompts, [""] * len(results), results, rewards, 0.0)
    steps = []
    for _ in range(args.steps):
        _sync()
        t = time.perf_counter()
        train_on_batch(cfg, policy, None, optimizer, batch)
        _sync()
        steps.append(time.perf_counter() - t)
    del policy, optimizer
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"tokens_per_s": tokens / rollout_s, "train_step_s": statistics.median(steps[1:] or steps),
            "unequal": unequal, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="a BF16 Qwen3 checkpoint (default: --shape, random weights)")
    ap.add_argument("--shape", default="qwen3-1.7b")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--kv-gb", type=float, default=16.0)
    ap.add_argument("--device", default="cuda", help="cuda (what it is for) or cpu (a smoke run of the script)")
    args = ap.parse_args()
    ckpt = Path(args.checkpoint) if args.checkpoint else shape_checkpoint(args.shape, Path(f"/tmp/{args.shape}"))
    invariant = measure(ckpt, INVARIANT_KERNELS, args)  # correctness first
    print(f"invariant kernels: {invariant['unequal']} of {invariant['tokens']} response tokens' logprobs differ "
          "between engine and trainer (must be 0)", flush=True)
    ordinary = measure(ckpt, DEFAULT_KERNELS, args)
    print(f"{args.prompts} prompts x {args.samples} samples x {args.new_tokens} tokens, {ckpt}")
    print(f"{'kernels':12s} {'rollout tok/s':>14s} {'train step s':>13s}")
    for label, r in (("ordinary", ordinary), ("invariant", invariant)):
        print(f"{label:12s} {r['tokens_per_s']:14.0f} {r['train_step_s']:13.3f}")
    print(f"mode on / off: rollout {invariant['tokens_per_s'] / ordinary['tokens_per_s']:.2f}x (ceiling >= 0.5x), "
          f"train step {invariant['train_step_s'] / ordinary['train_step_s']:.2f}x (ceiling <= 1.5x)")


if __name__ == "__main__":
    main()
