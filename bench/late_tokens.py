"""Experiment: fp8_gemv.cu's kernel with each K group's token codes loaded just before
that group is multiplied (not with its weights a round ahead), so no token registers
live across rounds, and register caps for more resident warps (cuda/late_gemv.cu).
Same arithmetic, so the bits of the fp8_gemv variant with as many token tiles, row tiles
and warps (checked first). Then per 8B shape at M = 16 the graph time (8 weight copies,
early launch as shipped, median of 20) against the shipped kernel; with --step-ab the
8B FP8 step with the best late variant per width class against the shipped kernels,
alternating twice.

    python bench/late_tokens.py [--step-ab --batches 16]
"""
import argparse
import re

import torch

from bench.gemv_cuda import COPIES, SHAPES, operands
from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels import cuda_jit, fp8_gemv

SOURCE = "late_gemv.cu"


def variants() -> list[tuple[str, fp8_gemv.GemvConfig]]:
    text = (cuda_jit.SOURCE_DIR / SOURCE).read_text()
    out = []
    for found in re.findall(r"^LATE\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)", text, re.M):
        mt, rt, w, u, p, b = map(int, found)
        out.append((f"late_mt{mt}_rt{rt}_w{w}_u{u}_p{p}_b{b}", fp8_gemv.GemvConfig(mt, rt, w, u, p)))
    return out


def launch(name, cfg, aq, a_s, wq, w_s, out=None, early=True):
    m, k = aq.shape
    n = wq.shape[0]
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    cuda_jit.load(SOURCE, aq.device).launch(
        name, (n // cfg.rows, 1, 1), (32 * cfg.warps, 1, 1), aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1),
        wq, wq.stride(0), w_s, w_s.stride(0), w_s.stride(1), y, y.stride(0), m, k, early=early)
    return y


def twin(cfg):
    return next(c for c in fp8_gemv.VARIANTS if (c.token_tiles, c.row_tiles, c.warps)
                == (cfg.token_tiles, cfg.row_tiles, cfg.warps))


def study(m=16):
    per_class, bad = {}, 0
    for shape, (n, k) in SHAPES.items():
        _, aq, a_s, ws = operands(m, n, k, COPIES)
        row = {"shipped": graph_time_us(lambda j: fp8_gemv.fp8_gemv(aq, a_s, ws[j].data, ws[j].scale), COPIES)}
        for name, cfg in variants():
            if n % cfg.rows:
                continue
            y = launch(name, cfg, aq, a_s, ws[0].data, ws[0].scale)
            want = fp8_gemv.fp8_gemv(aq, a_s, ws[0].data, ws[0].scale, twin(cfg), early=False)
            if not torch.equal(y, want) or not torch.equal(y, launch(name, cfg, aq, a_s, ws[0].data, ws[0].scale,
                                                                     early=False)):
                bad += 1
                print(f"BAD {name} {shape}: bits differ from {twin(cfg).kernel}", flush=True)
                continue
            row[name[5:]] = graph_time_us(lambda j: launch(name, cfg, aq, a_s, ws[j].data, ws[j].scale), COPIES)
        cls = fp8_gemv.width_class(n)
        for key, t in row.items():
            per_class.setdefault(cls, {}).setdefault(key, 0.0)
            per_class[cls][key] += t
        print(f"{shape:8s} M={m} bytes {n * k / 4.25e12 * 1e6:5.1f} | "
              + " ".join(f"{key}={t:.1f}" for key, t in row.items()), flush=True)
    best = {}
    for cls, entries in per_class.items():
        ranked = sorted(entries.items(), key=lambda e: e[1])
        print(f"class {cls}: " + ", ".join(f"{key} {t:.1f}" for key, t in ranked[:6])
              + f" (shipped {entries['shipped']:.1f})")
        if ranked[0][0] != "shipped":
            best[cls] = "late_" + ranked[0][0]
    print(f"late tokens: {bad} failures", flush=True)
    return bad, best


def step_ab(best: dict, batches: str):
    from bench.switch_ab import run_variants

    table = dict(variants())
    shipped = fp8_gemv.fp8_gemv

    def late_gemv(aq, a_s, wq, w_s, cfg=None, out=None, early=None):
        name = best.get(fp8_gemv.width_class(wq.shape[0]))
        if cfg is None and name and fp8_gemv.token_tiles(aq.shape[0]) == 2 and wq.shape[0] % table[name].rows == 0 \
                and fp8_gemv.supports(aq, wq, torch.bfloat16):
            return launch(name, table[name], aq, a_s, wq, w_s, out=out)
        return shipped(aq, a_s, wq, w_s, cfg, out=out, early=early)

    gemv = "quantroll.kernels.fp8_gemv"
    runs = []
    for i in range(2):
        runs += [(f"shipped{i}", []), (f"late{i}", [(gemv, "fp8_gemv", late_gemv)])]
    same_warps = all(table[name].warps == fp8_gemv.CHOICE[(2, cls)][2] for cls, name in best.items())
    run_variants(runs, [] if same_warps else ["late0", "late1"], "qwen3-8b", None, batches)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--step-ab", action="store_true")
    p.add_argument("--batches", default="16")
    args = p.parse_args()
    bad, best = study()
    if args.step_ab and best and not bad:
        step_ab(best, args.batches)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
