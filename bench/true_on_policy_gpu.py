"""True on-policy mode on the GPU: is the gap exactly zero, and what does the mode cost?

On a random-weight checkpoint of a real shape (default: Qwen3-1.7B, written to /tmp), for
the ordinary kernels and the batch-invariant ones (model/kernel_config.INVARIANT_KERNELS):
correctness first (with the invariant kernels, how many response tokens' engine logprobs
differ from the trainer's recomputation: must be 0), then rollout tokens/s (P prompts x n
samples x R new tokens, after a warm-up call) and the time of one training step
(rl/step.train_on_batch on that rollout: old logprobs, then the update; median of a few).
The issue's ceiling: rollout >= 0.5x and train step <= 1.5x the ordinary kernels'.

    python bench/true_on_policy_gpu.py [--checkpoint DIR] [--prompts 16 --samples 8 --new-tokens 256]
    python bench/true_on_policy_gpu.py --gemm-sweep   # the invariant GEMM's candidate tiles
    python bench/true_on_policy_gpu.py --profile      # the invariant decode step's kernels

--gemm-sweep times one decoder layer's GEMMs of the shape (q, k, v, o, gate, up, down) with
each candidate tile of the invariant GEMM at a decode step's rows and a trainer chunk's,
against cuBLAS: the evidence for InvariantGemmTiles' one choice (it must serve both).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from quantroll.bench.roofline import median_ms
from quantroll.bench.shapes import write_shape_checkpoint
from quantroll.engine import CacheConfig, Engine, SamplingParams
from quantroll.kernels.invariant_gemm import InvariantGemmTiles
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


class StatelessSGD:
    """The trainer's optimizer interface (rl/step.train_on_batch) with no state at all: the
    BF16 gradients accumulate in place and the step subtracts them. A timing stand-in only,
    for shapes whose AdamW state does not fit; both kernel sets get the same one."""

    def __init__(self, params, lr: float):
        self.params, self.lr = [p for p in params if p.requires_grad], lr

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def accumulate(self) -> None:
        pass  # autograd already sums each micro-batch's gradient into p.grad

    def grad_norm(self) -> float:
        return sum(float(p.grad.float().pow(2).sum()) for p in self.params if p.grad is not None) ** 0.5

    @torch.no_grad()
    def step(self, max_grad_norm: float | None = None) -> float:
        norm = self.grad_norm()
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)
        self.zero_grad()
        return norm


def measure(ckpt: Path, kernels, args) -> dict:
    engine = Engine(ckpt, device=args.device, kernels=kernels, cache=CacheConfig(memory_gb=args.kv_gb))
    gen = torch.Generator().manual_seed(0)
    distinct = [torch.randint(0, engine.config.vocab_size, (args.prompt_len,), generator=gen).tolist()
                for _ in range(args.prompts)]
    prompts = [p for p in distinct for _ in range(args.samples)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=1, stop_token_ids=())
    # warm-up on the whole batch: every kernel compiled and the batch's decode graph captured
    # before the clock starts (a warm-up of a few prompts left both inside the timed call)
    engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=0, stop_token_ids=()))
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
    # plain SGD keeps no state: the 8B shape's FP32 master copy and AdamW moments (~12 bytes a
    # parameter) do not fit one H200 beside its BF16 weights and gradients
    optimizer = (StatelessSGD(policy.parameters(), lr=1e-7) if args.optimizer == "sgd"
                 else MasterWeightAdamW(policy.parameters(), lr=1e-7))
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


SWEEP_TILES = ((64, 64, 64, 4, 3), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (64, 128, 64, 4, 4),
               (128, 64, 64, 4, 3), (128, 64, 64, 4, 4), (128, 128, 64, 4, 3), (128, 128, 64, 8, 3),
               (128, 128, 64, 8, 4), (128, 256, 64, 8, 3))


def profile_decode(ckpt: Path, kernels, args) -> None:
    """Per-kernel GPU time of the invariant engine's eager decode steps (8-token prompts, so
    that the prefill is a small share), beside the graphed engine's decode step."""
    from torch.profiler import ProfilerActivity, profile

    prompts = torch.randint(0, 1000, (args.prompts * args.samples, 8)).tolist()
    params = SamplingParams(temperature=1.0, max_new_tokens=33, seed=1, stop_token_ids=())
    graphed = Engine(ckpt, device="cuda", kernels=kernels, cache=CacheConfig(memory_gb=args.kv_gb))
    graphed.generate(prompts, params)
    graphed.generate(prompts, params)
    step_ms = graphed.last_stats["decode_step_ms"]
    del graphed
    eager = Engine(ckpt, device="cuda", kernels=kernels, cuda_graphs=False,
                   cache=CacheConfig(memory_gb=args.kv_gb))
    eager.generate(prompts, params)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eager.generate(prompts, params)
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) / 1e3
    print(f"invariant decode, batch {len(prompts)}: graphed step {step_ms:.2f} ms; eager profile of 32 steps + "
          f"prefill: {total:.1f} ms GPU ({total / 32:.2f} ms a step), {sum(e.count for e in events)} kernels")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:15]:
        print(f"  {e.self_device_time_total / 1e3 / 32:8.3f} ms/step {e.count // 32:5d}/step  {e.key[:80]}")


def gemm_sweep(shape: str, rows: tuple[int, ...] = (128, 512, 16384)) -> None:
    from quantroll.bench.shapes import shape_config
    from quantroll.kernels.invariant_gemm import invariant_gemm

    cfg = shape_config(shape)
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]  # apart, as the invariant forward runs them
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for n, k in shapes]

    def layer_us(m: int, run) -> float:
        """One layer's seven GEMMs replayed as one CUDA graph (launch costs out: a decode
        step's GEMMs are graphed in the engine too), median of 20 replays."""
        xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, k in shapes}

        def layer():
            for w in weights:
                run(xs[w.shape[1]], w)
        layer()  # compiles
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer()
        return median_ms(graph.replay, reps=20, warmup=3) * 1e3

    print(f"invariant GEMM tiles, one {shape} layer's GEMMs {shapes}: us (x cuBLAS)")
    base = {m: layer_us(m, lambda x, w: x @ w.t()) for m in rows}
    print(f"{'tile (m n k warps stages)':28s}" + "".join(f"{f'M={m}':>18s}" for m in rows))
    print(f"{'cublas':28s}" + "".join(f"{base[m]:18.1f}" for m in rows))
    for bm, bn, bk, warps, stages in SWEEP_TILES:
        tiles = InvariantGemmTiles(block_m=bm, block_n=bn, block_k=bk, warps=warps, stages=stages)
        try:
            cells = [layer_us(m, lambda x, w: invariant_gemm(x, w, tiles)) for m in rows]
        except Exception as exc:  # a tile the compiler cannot fit (shared memory) is a row of the table
            print(f"{str((bm, bn, bk, warps, stages)):28s} failed: {type(exc).__name__}")
            continue
        print(f"{str((bm, bn, bk, warps, stages)):28s}"
              + "".join(f"{c:11.1f} ({c / base[m]:.2f})" for c, m in zip(cells, rows)), flush=True)


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
    ap.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                    help="sgd: no optimizer state, for shapes whose AdamW state does not fit (8B on one H200)")
    ap.add_argument("--device", default="cuda", help="cuda (what it is for) or cpu (a smoke run of the script)")
    ap.add_argument("--gemm-sweep", action="store_true", help="time the invariant GEMM's candidate tiles instead")
    ap.add_argument("--profile", action="store_true", help="where the invariant decode step's GPU time goes instead")
    ap.add_argument("--gemm-tile", default=None, metavar="M,N,K,WARPS,STAGES",
                    help="the invariant GEMM's tile for this run (default: KernelConfig's)")
    args = ap.parse_args()
    invariant_kernels = INVARIANT_KERNELS
    if args.gemm_tile:
        bm, bn, bk, warps, stages = (int(v) for v in args.gemm_tile.split(","))
        invariant_kernels = dataclasses.replace(INVARIANT_KERNELS, invariant_gemm=InvariantGemmTiles(
            block_m=bm, block_n=bn, block_k=bk, warps=warps, stages=stages))
    if args.gemm_sweep:
        gemm_sweep(args.shape)
        return
    ckpt = Path(args.checkpoint) if args.checkpoint else shape_checkpoint(args.shape, Path(f"/tmp/{args.shape}"))
    if args.profile:
        profile_decode(ckpt, invariant_kernels, args)
        return
    invariant = measure(ckpt, invariant_kernels, args)  # correctness first
    print(f"invariant kernels: {invariant['unequal']} of {invariant['tokens']} response tokens' logprobs differ "
          "between engine and trainer (must be 0)", flush=True)
    ordinary = measure(ckpt, DEFAULT_KERNELS, args)
    print(f"{args.prompts} prompts x {args.samples} samples x {args.new_tokens} tokens, {ckpt}, optimizer "
          f"{args.optimizer}, micro-batch {args.micro_batch_size}, invariant GEMM tile {invariant_kernels.invariant_gemm}")
    print(f"{'kernels':12s} {'rollout tok/s':>14s} {'train step s':>13s}")
    for label, r in (("ordinary", ordinary), ("invariant", invariant)):
        print(f"{label:12s} {r['tokens_per_s']:14.0f} {r['train_step_s']:13.3f}")
    print(f"mode on / off: rollout {invariant['tokens_per_s'] / ordinary['tokens_per_s']:.2f}x (ceiling >= 0.5x), "
          f"train step {invariant['train_step_s'] / ordinary['train_step_s']:.2f}x (ceiling <= 1.5x)")


if __name__ == "__main__":
    main()
