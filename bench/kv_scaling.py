"""Which FP8 KV cache scaling: the logprob gap each adds to the BF16 cache's.

- per position and head (what the engine stores, formats/kv_fp8.py): each key/value vector
  scaled by its own amax / 448 when written; 4 bytes per vector (3% of an E4M3 head of 128);
- per layer and KV head, static (NeMo-RL's): one scale per layer, head and K/V, calibrated as
  amax / 448 over a calibration batch at each weight update; values beyond the calibrated
  amax saturate at 448. No bytes per position.

Sequences: the built-in model's held-out problems (or random prompts of --checkpoint's
vocabulary) continued by the BF16 engine at temperature 1 with EOS ignored; the calibration
batch is another set of the same. Each scaling's gap is the mean (and max) |logp - logp_bf16|
over the response tokens, the same sequences teacher-forced through the model with the
cache's quantize-dequantize applied to every key and value (exact emulation: what the GPU
kernels compute up to their own rounding). Runs on the CPU (minutes) or a GPU.

    python bench/kv_scaling.py [--prompts 32] [--new-tokens 256] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn.functional as F

from quantroll.builtin import builtin_checkpoint
from quantroll.engine import Engine, SamplingParams
from quantroll.formats.elements import to_e4m3
from quantroll.formats.kv_fp8 import dequantize_kv, quantize_kv

E4M3_MAX = 448.0


def _sdpa(q, k, v):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def per_position_attend(layer, q, k, v):
    k, v = (dequantize_kv(*quantize_kv(t)).to(t.dtype) for t in (k, v))
    return _sdpa(q, k, v)


class Calibrate:
    """An attend that records each layer's amax per KV head of keys and values."""

    def __init__(self):
        self.amax: dict[tuple[int, str], torch.Tensor] = {}

    def __call__(self, layer, q, k, v):
        for name, t in (("k", k), ("v", v)):
            a = t.detach().float().abs().amax(dim=(0, 1, 3))  # [Hkv]
            key = (layer, name)
            self.amax[key] = torch.maximum(self.amax[key], a) if key in self.amax else a
        return _sdpa(q, k, v)


class StaticAttend:
    """Keys and values quantized with one calibrated scale per layer, KV head and K/V."""

    def __init__(self, amax: dict[tuple[int, str], torch.Tensor]):
        self.scales = {key: (a / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny) for key, a in amax.items()}
        self.clipped = 0
        self.elements = 0

    def __call__(self, layer, q, k, v):
        out = []
        for name, t in (("k", k), ("v", v)):
            s = self.scales[(layer, name)].to(t.device)[None, None, :, None]
            x = t.float() / s
            self.clipped += int((x.abs() > E4M3_MAX).sum())
            self.elements += x.numel()
            out.append((to_e4m3(x.clamp(-E4M3_MAX, E4M3_MAX)).float() * s).to(t.dtype))
        return _sdpa(q, *out)


def continuations(engine: Engine, prompts: list[list[int]], new_tokens: int, seed: int) -> list[tuple[list[int], list[int]]]:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=(), seed=seed)
    return [(r.prompt_tokens, r.tokens) for r in engine.generate(prompts, params)]


@torch.no_grad()
def response_logprobs(model, seqs, attend) -> list[torch.Tensor]:
    out = []
    device = next(model.parameters()).device
    for prompt, tokens in seqs:
        ids = torch.tensor([prompt + tokens], device=device)
        logits = model(ids, attend=attend)[0, len(prompt) - 1: -1].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens, device=device)[:, None])[:, 0].cpu())
    return out


def prompts_for(checkpoint, engine: Engine, n: int, seed: int) -> list[list[int]]:
    if checkpoint is None:
        from quantroll.tasks.arithmetic import ArithmeticTask
        from quantroll.tasks.base import held_out_problems
        from quantroll.tasks.tokenizer import load_tokenizer

        tok = load_tokenizer(builtin_checkpoint("dense"))
        return [tok.encode(p.prompt).ids for p in held_out_problems(ArithmeticTask(), n, seed)]
    rng = random.Random(seed)
    return [[rng.randrange(engine.config.vocab_size) for _ in range(64)] for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="a Qwen3 checkpoint (default: the built-in dense model)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    engine = Engine(args.checkpoint or builtin_checkpoint("dense"), device=args.device)
    model = engine.model
    measured = continuations(engine, prompts_for(args.checkpoint, engine, args.prompts, 1), args.new_tokens, seed=1)
    calibration = continuations(engine, prompts_for(args.checkpoint, engine, args.prompts, 2), args.new_tokens, seed=2)
    calibrate = Calibrate()
    response_logprobs(model, calibration, calibrate)
    reference = response_logprobs(model, measured, None)
    static = StaticAttend(calibrate.amax)
    rows = [("per position and head (engine)", per_position_attend, "4 per head vector"),
            ("per layer and head, static", static, "0")]
    print(f"{args.prompts} sequences x {args.new_tokens} tokens, {engine.precision} weights, {args.device}")
    print(f"{'KV scaling':32s} {'mean |dlogp|':>12s} {'max |dlogp|':>11s} {'scale bytes/position/head':>26s}")
    for label, attend, scale_bytes in rows:
        got = response_logprobs(model, measured, attend)
        diff = torch.cat([(a - b).abs() for a, b in zip(got, reference)])
        print(f"{label:32s} {diff.mean().item():12.3e} {diff.max().item():11.3e} {scale_bytes:>26s}")
    print(f"static: {static.clipped} of {static.elements} elements beyond the calibrated amax (saturated)")


if __name__ == "__main__":
    main()
