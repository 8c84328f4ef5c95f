"""Two figures of the FP8 GEMM work on the GPU (docs/PERFORMANCE.md):

1. The step-0 train/rollout gap of the shipped built-in model (mean |logp_train -
   logp_rollout| over response tokens, 256 held-out arithmetic prompts, T = 1), with the real
   FP8 kernels and with exact emulation side by side: mode 1 (FP8 engine, BF16 trainer) and
   mode 2 (both sides block FP8).
2. The trainer's step on a real shape (random weights): forward + backward of the
   response logprobs, BF16 against the mode-2 forward (real FP8 GEMMs of the engine's table,
   and exact emulation), CUDA events after warm-up, median.

    python bench/mode2_gpu.py [--shape qwen3-1.7b] [--rows 32] [--prompt-len 128] [--response-len 256]
"""
import argparse
import tempfile

import torch

from quantroll.bench.roofline import median_ms
from quantroll.bench.shapes import random_model, shape_config
from quantroll.builtin import builtin_checkpoint
from quantroll.checkpoint.bf16_rule import kept_by_name
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.engine import CacheConfig, Engine, SamplingParams
from quantroll.formats import get_format
from quantroll.model.kernel_config import TrainFormat
from quantroll.tasks.arithmetic import ArithmeticTask
from quantroll.tasks.base import held_out_problems
from quantroll.tasks.tokenizer import encode
from quantroll.trainer.policy import load_policy, response_logprobs

DEV = "cuda"


def step0_gaps(n_prompts: int = 256) -> dict[str, float]:
    bf16_dir = builtin_checkpoint("dense")
    fp8_dir = tempfile.mkdtemp() + "/fp8"
    convert_checkpoint(bf16_dir, fp8_dir, ConvertConfig(format="fp8", progress=False))
    prompts = [encode(p.prompt) for p in held_out_problems(ArithmeticTask(), n_prompts, seed=0)]
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    fmt = get_format("fp8")
    out = {}
    for kernels, real in (("real FP8 kernels", True), ("exact emulation", False)):
        engine = Engine(fp8_dir, device=DEV, fp8_kernels=real, cache=CacheConfig(memory_gb=2))
        results = engine.generate(prompts, params)
        names = set(engine.quantized_layers())
        for mode in (1, 2):
            train = TrainFormat(fmt, frozenset(names), real) if mode == 2 else None
            policy = load_policy(bf16_dir, device=DEV, train=train)
            with torch.no_grad():
                logp, mask = response_logprobs(policy, [r.prompt_tokens for r in results],
                                               [r.tokens for r in results], params.temperature)
            rollout = torch.zeros_like(logp)
            for i, r in enumerate(results):
                rollout[i, :len(r.logprobs)] = torch.tensor(r.logprobs, device=DEV)
            out[(mode, kernels)] = float(((logp - rollout).abs() * mask).sum() / mask.sum())
        del engine
    return out


def trainer_steps(shape: str, rows: int, prompt_len: int, response_len: int) -> dict[str, float]:
    cfg = shape_config(shape)
    policy = random_model(cfg, DEV).train()
    names = {m.name for m in policy.modules() if hasattr(m, "train_format") and not kept_by_name(m.name)}
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size, (rows, prompt_len), generator=g).tolist()
    responses = torch.randint(0, cfg.vocab_size, (rows, response_len), generator=g).tolist()

    def step():
        policy.zero_grad(set_to_none=True)
        logp, mask = response_logprobs(policy, prompts, responses, 1.0)
        (-(logp * mask).sum() / mask.sum()).backward()

    fmt = get_format("fp8")
    out = {}
    for label, train_format, real in (("bf16", None, False), ("mode 2, real FP8", fmt, True),
                                      ("mode 2, emulated", fmt, False)):
        set_train_format(policy, names, train_format, real)
        out[label] = median_ms(step, reps=7, warmup=2)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen3-1.7b")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--response-len", type=int, default=256)
    args = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    gaps = step0_gaps()
    steps = trainer_steps(args.shape, args.rows, args.prompt_len, args.response_len)
    print("\nstep-0 gap, built-in dense model, 256 prompts (mean |logp diff| over response tokens)")
    print(f"{'mode':8s} {'real FP8 kernels':>18s} {'exact emulation':>18s}")
    for mode in (1, 2):
        print(f"{mode:<8d} {gaps[(mode, 'real FP8 kernels')]:18.3e} {gaps[(mode, 'exact emulation')]:18.3e}")
    print(f"\ntrainer forward + backward, {args.shape}, {args.rows} x ({args.prompt_len} + {args.response_len}) tokens")
    for label, ms in steps.items():
        print(f"{label:20s} {ms:9.1f} ms  {ms / steps['bf16']:5.2f}x bf16")


if __name__ == "__main__":
    main()
