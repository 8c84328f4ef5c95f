"""The FP8 (or BF16) decode step with experimental kernel switches on, against the shipped settings,
on one model (random weights of a real shape): correctness first, then the step times.

For each variant (a set of module-level switches under quantroll.kernels), a fresh
engine on the same FP8 model generates 4 prompts x 16 tokens at temperature 1 with a
fixed seed; variants meant to give the shipped bits must give the shipped tokens and
logprobs exactly (reported per variant; `--approx NAME` marks a variant whose arithmetic
differs and which is then compared by mean |logprob difference| only). Then
`quantroll bench rollout`'s measurement (bench_one: 128-token prompts, 256 new tokens,
CUDA-graph decode, median of the repeats) at each batch.

    python bench/switch_ab.py --variant norm8:fused.NORM_WARPS=8 --approx norm8 --batches 1,16,64 \\
        [--shape qwen3-8b] [--layers N]

A value is a Python literal or an expression over the module's names, e.g.
``--variant tiles:fp8_gemv.CHOICE={**CHOICE,(2,'wide'):(2,2,8,1,0)}``.
"""
import argparse
import ast
import importlib

import torch

from quantroll.bench.rollout import bench_one, copy_bandwidth
from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.formats import get_format


def setting_value(module: str, text: str):
    """A Python literal, or an expression over the target module's names (e.g.
    ``fp8_gemv.CHOICE={**CHOICE,(2,'wide'):(2,2,8,1,0)}``)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return eval(text, {"__builtins__": {}}, vars(importlib.import_module(module)))  # a bench's own command line


def top_level_items(body: str) -> list[str]:
    """``body`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    return items + [body[start:]]


def parse_variant(text: str) -> tuple[str, list[tuple[str, str, object]]]:
    name, _, body = text.partition(":")
    settings = []
    for item in filter(None, top_level_items(body)):
        target, _, value = item.partition("=")
        module, _, attr = target.rpartition(".")
        settings.append((f"quantroll.kernels.{module}", attr, setting_value(f"quantroll.kernels.{module}", value)))
    return name, settings


def apply(settings, originals=None) -> dict:
    """Set the switches; returns the previous values (pass them back to restore)."""
    previous = {}
    for module, attr, value in settings:
        mod = importlib.import_module(module)
        previous[(module, attr)] = getattr(mod, attr)
        setattr(mod, attr, value if originals is None else originals[(module, attr)])
    return previous


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", action="append", default=[], help="NAME:module.ATTR=value[,module.ATTR=value]")
    p.add_argument("--approx", action="append", default=[], help="variant names whose bits may differ")
    p.add_argument("--shape", default="qwen3-8b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--precision", default="fp8", choices=("fp8", "bf16"))
    p.add_argument("--device", default="cuda", help="cuda (what it is for); cpu only to smoke-test the script")
    args = p.parse_args()
    variants = [("shipped", [])] + [parse_variant(v) for v in args.variant]
    run_variants(variants, args.approx, args.shape, args.layers, args.batches, args.repeats, args.precision,
                 args.device)


def run_variants(variants, approx, shape="qwen3-8b", layers=None, batches="1,16,64", repeats=2, precision="fp8",
                 device="cuda") -> list:
    """Each (name, settings) variant on one random model of ``shape``: its tokens against the
    first variant's (bit for bit, or by ``approx_check`` for names in ``approx``), then its
    decode step at each batch; prints the table and returns its rows."""
    args = argparse.Namespace(approx=approx, batches=batches, repeats=repeats, precision=precision, device=device,
                              shape=shape)
    cfg = shape_config(shape, layers)
    fmt = get_format("fp8") if precision == "fp8" else None  # None: the BF16 engine
    model = random_model(cfg, device, fmt=fmt)
    bandwidth = copy_bandwidth(device) if device == "cuda" else 1e11  # (a CPU smoke run: any figure)
    prompts = [list(range(1 + 50 * i, 60 + 50 * i + 7 * i)) for i in range(4)]
    params = SamplingParams(temperature=1.0, max_new_tokens=16, stop_token_ids=(), seed=11)
    reference_box, rows = [], []
    for name, settings in variants:
        previous = apply(settings)
        try:
            measure(name, model, fmt, prompts, params, args, cfg, bandwidth, reference_box, rows)
        except Exception as e:  # one failing variant must not cost the others
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
            rows.append((name, 0, float("nan"), float("nan"), f"FAILED {type(e).__name__}"))
        finally:
            apply(settings, previous)
    width = max(12, *(len(name) for name, _ in variants))
    print(f"\n{shape} ({cfg.num_hidden_layers} layers) {precision} decode step, "
          f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(f"{'variant':{width}s} {'batch':>5s} {'step ms':>8s} {'x roof':>6s}  check")
    for name, b, ms, xr, check in rows:
        print(f"{name:{width}s} {b:5d} {ms:8.3f} {xr:6.2f}  {check}")
    return rows


def approx_check(reference, out) -> str:
    """Tokens equal or not, and mean |logprob difference| over the positions before each
    prompt's first differing token (after it the two runs sample from different prefixes,
    so their logprobs are no longer comparable)."""
    diffs, first = [], []
    for r, o in zip(reference, out):
        for i, (tr, to, lr, lo) in enumerate(zip(r.tokens, o.tokens, r.logprobs, o.logprobs)):
            if tr != to:
                first.append(i)
                break
            diffs.append(abs(lr - lo))
    mean = sum(diffs) / max(len(diffs), 1)
    where = f"first difference at step {min(first)}" if first else "tokens same"
    return f"approx: {where}; mean |dlogprob| before it {mean:.1e} over {len(diffs)} tokens"


def measure(name, model, fmt, prompts, params, args, cfg, bandwidth, reference_box, rows):
    """One variant: its tokens against the shipped ones (the first variant's), then its
    step at each batch."""
    engine = Engine.from_model(model, fmt, args.device)
    out = engine.generate(prompts, params)
    if not reference_box:
        reference_box.append(out)
        check = "reference"
    elif name in args.approx:
        check = approx_check(reference_box[0], out)
    else:
        same = all(r.tokens == o.tokens and r.logprobs == o.logprobs for r, o in zip(reference_box[0], out))
        check = "same bits" if same else "BITS DIFFER"
    print(f"{name}: {check}", flush=True)
    for b in (int(v) for v in args.batches.split(",")):
        label = f"{args.precision} {name}"
        r = bench_one(engine, args.shape, cfg.num_hidden_layers, label, b, 128, 256, bandwidth, args.repeats)
        rows.append((name, b, r.decode_step_ms, r.step_over_roofline, check))
        print(f"  batch {b}: {r.decode_step_ms:.3f} ms ({r.step_over_roofline:.2f}x roofline)", flush=True)
    del engine
    if args.device == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
