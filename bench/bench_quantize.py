"""Benchmark the GPU weight-quantize path (the work of every RL weight update).

    python bench/bench_quantize.py [--sweep] [--json out.json] [--formats nvfp4] [--skip-model]

1. Correctness first: each format on a 4096x12288 bf16 weight, GPU == CPU reference
   byte for byte (exit 1 otherwise); the many-weight paths are checked too.
2. Ceiling: device-to-device copy bandwidth of a 4 GB buffer, counting bytes read and
   written.
3. Timings (CUDA events around back-to-back runs, median of many after warm-up; no
   L2 flush, see Timer):
   - a 4096x12288 bf16 weight per format: a CUDA graph over 8 distinct such weights,
     time / 8 (out= buffers, no NaN check: the kernels); plus one eager call's latency;
   - all 252 linear weights of a Qwen3-8B-shaped model at once: eager launches
     (quantize_weights_gpu), CUDA-graph replay (QuantizePlan.run), each without and
     with the NaN/Inf check (one device-to-host sync).
   Effective bandwidth = (bytes read + bytes written, scales included) / time. Floors:
   fp8 and mxfp8 >= 70% of copy bandwidth; nvfp4 reads its input twice (global amax,
   then the groups), so its floor is 70% of that two-pass bound at copy bandwidth.
   --sweep first times a few tile configs per format on the single weight and uses the
   best everywhere after (record the winner in quantize_triton.CONFIGS); for NVFP4 it times
   the two passes apart, pass 2 over the bf16 kernel's tiles (and the generic kernel, for
   reference), each config's bytes checked against the CPU reference first.
   --formats restricts everything to some formats (e.g. nvfp4).
Prints JSON, then a short table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from quantroll.formats import get_format
from quantroll.kernels import QuantizePlan, allocate_quantized, quantize_weight_gpu, quantize_weights_gpu

FORMATS = [("fp8", None), ("mxfp8", "ceil"), ("mxfp8", "ocp"), ("nvfp4", None)]
QWEN3_8B_LAYER = {  # [out, in] of each linear weight in one decoder layer
    "self_attn.q_proj": (4096, 4096),
    "self_attn.k_proj": (1024, 4096),
    "self_attn.v_proj": (1024, 4096),
    "self_attn.o_proj": (4096, 4096),
    "mlp.gate_proj": (12288, 4096),
    "mlp.up_proj": (12288, 4096),
    "mlp.down_proj": (4096, 12288),
}
QWEN3_8B_LAYERS = 36
SINGLE = (4096, 12288)
FLOOR = 0.70
SWEEP = {
    "fp8": [{"num_warps": 4}, {"num_warps": 8}],
    "mxfp8": [
        {"BM": 8, "G": 8, "num_warps": 2},
        {"BM": 16, "G": 8, "num_warps": 4},
    ],
    "nvfp4": [  # pass 2 alone: the bf16 kernel (rows of whole groups), then the generic one
        {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 1, "PREFETCH": False},
        {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 4, "PREFETCH": False},
        {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 8, "PREFETCH": False},
        {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 8, "PREFETCH": False, "maxnreg": 64},
        {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 4, "PREFETCH": True},
        {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 8, "PREFETCH": True},
        {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 8, "PREFETCH": True, "maxnreg": 96},
        {"BM": 4, "G": 16, "num_warps": 2, "ITERS": 8, "PREFETCH": False},
        {"BM": 4, "G": 16, "num_warps": 2, "ITERS": 8, "PREFETCH": True},
        {"BM": 8, "G": 16, "num_warps": 4, "ITERS": 4, "PREFETCH": False},
        {"BM": 8, "G": 32, "num_warps": 4, "ITERS": 4, "PREFETCH": False},
        {"BM": 16, "G": 16, "num_warps": 2, "ITERS": 4, "PREFETCH": False},
        {"BM": 32, "G": 16, "num_warps": 4, "ITERS": 2, "PREFETCH": False},
        {"generic": True, "BM": 8, "G": 16, "num_warps": 2},
    ],
    "nvfp4_pass1": [  # the amax pass alone
        {"BLOCK": 4096, "num_warps": 8, "ctas_per_sm": 16},
        {"BLOCK": 4096, "num_warps": 8, "ctas_per_sm": 8},
        {"BLOCK": 8192, "num_warps": 8, "ctas_per_sm": 8},
    ],
}


def fmt_label(name: str, rule: str | None) -> str:
    return name if rule is None else f"{name}-{rule}"


class Timer:
    """Median of CUDA-event timings of fn() over many runs after warm-up.

    No L2 flush between runs: zeroing a flush buffer leaves up to 60 MB of dirty lines
    whose write-back lands in the next timed run (it cost a pure-read kernel of 100 MB
    about a third of its time here). Inputs are instead far larger than L2 (8 distinct
    weights of 100 MB for the single-weight case, 14 GB for the model) and runs go back
    to back, as they do in a weight sync, so each run also pays for its predecessor's
    write-backs, the steady state."""

    def __call__(self, fn, warmup: int = 3, reps: int = 30) -> dict:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        events = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in events)
        return {"median_ms": statistics.median(ms), "min_ms": ms[0], "p90_ms": ms[int(0.9 * (len(ms) - 1))], "reps": reps}


def graphed(fn):
    """fn's launches captured once as a CUDA graph (after one eager run); returns replay."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def per_weight(t: dict, n: int) -> dict:
    return {k: (v / n if k.endswith("_ms") else v) for k, v in t.items()}


def io_bytes(ws: list[torch.Tensor], qs) -> tuple[int, int]:
    read = sum(w.numel() * w.element_size() for w in ws)
    written = sum(q.nbytes for q in qs)
    return read, written


def rate(name: str, read: int, written: int, ms: float, copy_bw: float) -> dict:
    bw = (read + written) / (ms * 1e-3)
    if name == "nvfp4":
        bound_ms = (2 * read + written) / copy_bw * 1e3
        frac = bound_ms / ms
    else:
        bound_ms = (read + written) / copy_bw * 1e3
        frac = bw / copy_bw
    return {"GBps": bw / 1e9, "bound_ms": bound_ms, "fraction_of_floor_basis": frac, "meets_floor": frac >= FLOOR}


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def same_q(a, b) -> bool:
    ok = same_bytes(a.data, b.data) and same_bytes(a.scale, b.scale) and a.data.shape == b.data.shape
    if a.global_scale is not None:
        ok = ok and same_bytes(a.global_scale.reshape(1), b.global_scale.reshape(1).to(a.global_scale.device))
    return ok


def test_weight(shape, seed: int) -> torch.Tensor:
    """bf16 weight ~N(0, 0.02) with rows of other magnitudes and a few zero groups."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(shape, device="cuda", generator=g) * 0.02
    w[::97] *= 1e3
    w[5::101] *= 1e-4
    w[3, :64] = 0
    return w.to(torch.bfloat16)


def check_correctness(log, formats) -> bool:
    ok_all = True
    w = test_weight(SINGLE, 0)
    w_cpu = w.cpu()
    for name, rule in formats:
        fmt = get_format(name, scale_rule=rule)
        ref = fmt.quantize_weight(w_cpu)
        got = quantize_weight_gpu(w, fmt, "single").to("cpu")
        ok = same_q(ref, got)
        ref_cuda = fmt.quantize_weight(w)  # the pure reference run by torch on the GPU, for information
        log[f"correct_{fmt_label(name, rule)}"] = ok
        log[f"reference_on_cuda_equals_cpu_{fmt_label(name, rule)}"] = same_q(ref, ref_cuda.to("cpu"))
        ok_all &= ok
        print(f"correctness {fmt_label(name, rule):11s} {SINGLE}: {'OK' if ok else 'MISMATCH'}"
              f" (reference run on cuda equals cpu: {log[f'reference_on_cuda_equals_cpu_{fmt_label(name, rule)}']})",
              flush=True)
    return ok_all


def copy_bandwidth(timer: Timer) -> dict:
    n = 4 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src), warmup=3, reps=20)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": 2 * n, **t, "GBps": 2 * n / (t["median_ms"] * 1e-3) / 1e9}


def sweep_nvfp4_passes(timer: Timer, ws: list, outs: list, log) -> dict:
    from quantroll.kernels import quantize_triton as qt

    n = len(ws)
    amax = torch.zeros(n, dtype=torch.int32, device="cuda")
    read = ws[0].numel() * ws[0].element_size()
    p1 = []
    for cfg in SWEEP["nvfp4_pass1"]:
        run = graphed(lambda: [qt.launch_absmax(w, amax, i, **cfg) for i, w in enumerate(ws)])
        t = per_weight(timer(run), n)
        p1.append({"cfg": cfg, **t, "read_GBps": read / (t["median_ms"] * 1e-3) / 1e9})
        print(f"nvfp4 pass 1 (amax) {cfg}: {t['median_ms'] * 1e3:6.1f} us  {p1[-1]['read_GBps']:5.0f} GB/s read", flush=True)
    ref = get_format("nvfp4").quantize_weight(ws[0].cpu())  # each pass-2 config must give these bytes
    p2 = []
    for cfg in SWEEP["nvfp4"]:
        outs[0].data.zero_()
        outs[0].scale.view(torch.uint8).zero_()
        run = graphed(lambda: [qt.launch_nvfp4(w, q.data, q.scale, q.global_scale, amax, i, **cfg)
                               for i, (w, q) in enumerate(zip(ws, outs))])
        ok = same_q(ref, type(ref)(outs[0].data.cpu(), outs[0].scale.cpu(), "nvfp4", ref.shape, ref.block,
                                   outs[0].global_scale.cpu()))
        t = per_weight(timer(run), n)
        p2.append({"cfg": cfg, **t, "correct": ok})
        print(f"nvfp4 pass 2 (groups) {cfg}: {t['median_ms'] * 1e3:6.1f} us  correct={ok}", flush=True)
    log["nvfp4_pass_sweep"] = {"pass1": p1, "pass2": p2}
    b1 = min(p1, key=lambda r: r["median_ms"])
    b2 = min((r for r in p2 if r["correct"]), key=lambda r: r["median_ms"])
    log["nvfp4_pass1_amax_ms"], log["nvfp4_pass1_read_GBps"] = b1["median_ms"], b1["read_GBps"]
    log["nvfp4_pass2_ms"] = b2["median_ms"]
    log["nvfp4_pass2_sweep_all_correct"] = all(r["correct"] for r in p2)
    return {**b2["cfg"], "absmax": b1["cfg"]}


def bench_single(timer: Timer, copy_bw: float, sweep: bool, log, formats) -> dict[str, dict]:
    """Per-weight time of 4096x12288 bf16 weights: a CUDA graph quantizing 8 distinct ones
    back to back (800 MB in, far beyond L2), divided by 8; out= buffers, no NaN check."""
    n = 8
    ws = [test_weight(SINGLE, 1 + i) for i in range(n)]
    best_cfg = {}
    for name, rule in formats:
        fmt = get_format(name, scale_rule=rule)
        label = fmt_label(name, rule)
        outs = [allocate_quantized(SINGLE, fmt, "cuda") for _ in range(n)]
        read, written = io_bytes(ws[:1], outs[:1])
        cfgs = SWEEP[name] if (sweep and rule != "ocp") else [best_cfg.get(name, {})]
        if name == "nvfp4" and sweep:  # sweep the two passes apart, then time the best pair together
            cfgs = [sweep_nvfp4_passes(timer, ws, outs, log)]
        rows = []
        for cfg in cfgs:
            plan = QuantizePlan(ws, fmt, outs=outs, **cfg)
            t = per_weight(timer(lambda: plan.run(check_finite=False)), n)
            r = {"cfg": cfg, **t, **rate(name, read, written, t["median_ms"], copy_bw)}
            rows.append(r)
            print(f"single {label:11s} cfg={cfg}: {t['median_ms'] * 1e3:7.1f} us  {r['GBps']:7.0f} GB/s  "
                  f"{100 * r['fraction_of_floor_basis']:5.1f}%", flush=True)
            del plan
        best = min(rows, key=lambda r: r["median_ms"])
        best_cfg.setdefault(name, best["cfg"])
        # one eager call as a caller makes it: allocation, launches, the NaN/Inf check's sync
        full = timer(lambda: quantize_weight_gpu(ws[0], fmt, "w", **best_cfg[name]))
        log[f"single_{label}"] = {"shape": SINGLE, "read_bytes": read, "written_bytes": written, "best": best,
                                  "sweep": rows if len(rows) > 1 else None,
                                  "one_eager_call_with_check_ms": full["median_ms"]}
        print(f"single {label:11s} one eager call (allocate, launch, NaN check): {full['median_ms'] * 1e3:.1f} us",
              flush=True)
        del outs
    if "nvfp4_pass1_amax_ms" in log:
        print(f"nvfp4 passes apart: amax {log['nvfp4_pass1_amax_ms'] * 1e3:.1f} us "
              f"({log['nvfp4_pass1_read_GBps']:.0f} GB/s read), groups {log['nvfp4_pass2_ms'] * 1e3:.1f} us", flush=True)
    log["chosen_cfg"] = best_cfg
    del ws
    torch.cuda.empty_cache()
    return best_cfg


def bench_model(timer: Timer, copy_bw: float, best_cfg: dict, log, formats) -> None:
    names, ws = [], []
    for layer in range(QWEN3_8B_LAYERS):
        for i, (lname, shape) in enumerate(QWEN3_8B_LAYER.items()):
            names.append(f"model.layers.{layer}.{lname}.weight")
            ws.append(test_weight(shape, 1000 * layer + i))
    log["model"] = {"weights": len(ws), "params": sum(w.numel() for w in ws)}
    for name, rule in formats:
        fmt = get_format(name, scale_rule=rule)
        label = fmt_label(name, rule)
        cfg = best_cfg.get(name, {})
        plan = QuantizePlan(ws, fmt, names, **cfg)
        outs = plan.outputs
        # correctness: graph replay == eager launches, every weight; CPU reference on two weights
        eager = quantize_weights_gpu(ws, fmt, names, **cfg)
        plan.run()
        ok = all(same_q(a, b) for a, b in zip(eager, outs))
        for i in (2, 4):  # layer 0 k_proj [1024, 4096] and gate_proj [12288, 4096]
            ok &= same_q(fmt.quantize_weight(ws[i].cpu()), outs[i].to("cpu"))
        del eager
        read, written = io_bytes(ws, outs)
        res = {"correct": ok, "read_bytes": read, "written_bytes": written}
        runs = {
            "eager": lambda: quantize_weights_gpu(ws, fmt, names, outs=outs, check_finite=False, **cfg),
            "eager_checked": lambda: quantize_weights_gpu(ws, fmt, names, outs=outs, check_finite=True, **cfg),
            "graph": lambda: plan.run(check_finite=False),
            "graph_checked": lambda: plan.run(check_finite=True),
        }
        if name == "nvfp4":  # without the side stream that overlaps pass 1 with pass 2
            plan_seq = QuantizePlan(ws, fmt, names, overlap=False, **cfg)
            ok &= all(same_q(a, b) for a, b in zip(plan_seq.outputs, outs))
            res["correct"] = ok
            runs["graph_no_overlap"] = lambda: plan_seq.run(check_finite=False)
        for key, fn in runs.items():
            t = timer(fn, warmup=3, reps=15)
            res[key] = {**t, **rate(name, read, written, t["median_ms"], copy_bw)}
            print(f"model  {label:11s} {key:13s}: {t['median_ms']:7.3f} ms  {res[key]['GBps']:7.0f} GB/s  "
                  f"{100 * res[key]['fraction_of_floor_basis']:5.1f}%  correct={ok}", flush=True)
        log[f"model_{label}"] = res
        plan_seq = None
        del plan, outs
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", action="store_true", help="time a few tile configs per format first; use the best")
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("--skip-model", action="store_true", help="only the single weight")
    ap.add_argument("--formats", default="", help="comma-separated subset: fp8, mxfp8, nvfp4 (default: all)")
    args = ap.parse_args()
    wanted = {f.strip() for f in args.formats.split(",") if f.strip()}
    formats = [f for f in FORMATS if not wanted or f[0] in wanted]
    if not torch.cuda.is_available():
        print("bench_quantize needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    log = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "command": "python " + " ".join(sys.argv),
    }
    correct = check_correctness(log, formats)
    timer = Timer()
    copy = copy_bandwidth(timer)
    log["copy"] = copy
    copy_bw = copy["GBps"] * 1e9
    print(f"copy bandwidth: {copy['GBps']:.0f} GB/s (read + written)", flush=True)
    best_cfg = bench_single(timer, copy_bw, args.sweep, log, formats)
    correct &= log.get("nvfp4_pass2_sweep_all_correct", True)
    if not args.skip_model:
        bench_model(timer, copy_bw, best_cfg, log, formats)
        correct &= all(log[k]["correct"] for k in log if k.startswith("model_"))

    print(json.dumps(log, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(log, f, indent=1, default=str)
    print(f"\ncopy {copy['GBps']:.0f} GB/s; floors: fp8/mxfp8 {FLOOR:.0%} of copy, nvfp4 {FLOOR:.0%} of its two-pass bound")
    if "nvfp4_pass_sweep" in log:
        for r in log["nvfp4_pass_sweep"]["pass2"]:
            print(f"nvfp4 pass 2 {str(r['cfg']):80s} {r['median_ms'] * 1e3:7.1f} us  correct={r['correct']}")
        print(f"nvfp4 pass 1 best {log['nvfp4_pass1_amax_ms'] * 1e3:.1f} us; chosen {log['chosen_cfg'].get('nvfp4')}")
    print(f"{'case':34s} {'ms':>8s} {'GB/s':>7s} {'% basis':>8s} floor")
    for name, rule in formats:
        label = fmt_label(name, rule)
        b = log[f"single_{label}"]["best"]
        print(f"{'single 4096x12288 ' + label:34s} {b['median_ms']:8.4f} {b['GBps']:7.0f} "
              f"{100 * b['fraction_of_floor_basis']:7.1f}% {'ok' if b['meets_floor'] else 'MISS'}")
        if f"model_{label}" in log:
            for key in ("eager", "graph", "graph_checked", "graph_no_overlap"):
                if key not in log[f"model_{label}"]:
                    continue
                m = log[f"model_{label}"][key]
                print(f"{'qwen3-8b x252 ' + label + ' ' + key:34s} {m['median_ms']:8.3f} {m['GBps']:7.0f} "
                      f"{100 * m['fraction_of_floor_basis']:7.1f}% {'ok' if m['meets_floor'] else 'MISS'}")
    print("correctness:", "OK" if correct else "MISMATCH")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
