"""The long-response study's measurements outside `compare` (bench/long_study.sh), and its call records.

``sample``: what the study model does at each candidate fib length, as RL's rollout will
see it: one sample per problem at temperature 1 through a BF16 engine copy of the
model (KV cache, batched), scored exactly (pass rate = the exact reward's mean) and with
partial credit (the leading correct lines' share), and the policy's mean per-token
entropy on its own samples (the trainer's BF16 forward over prompt + response, the
distribution each response token was drawn from). The calibrate job reads it to choose
the knob (the exact reward should land in 0.3-0.8 at each studied length); the gap job
reads the entropy beside the gap from the runs' own `entropy` metric.

``record``: one JSON line per call of a job: what ran where (GPU, commit, date, the
commands, exit status, seconds), appended to the job's calls.jsonl.

Usage (PYTHONPATH at the repository root)::

    python bench/long_study_sample.py sample --model DIR --lengths 4096,8192 --problems 32 --json F
    python bench/long_study_sample.py record --job sft --file calls.jsonl --rc 0 --seconds 512 --commands F
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import socket
import subprocess
import sys
from pathlib import Path

LOW, HIGH = 0.3, 0.8  # the exact reward the study's knob should give after SFT (issue 42)


def sample(model: str, lengths: list[int], terms: int, problems: int, seed: int, device: str) -> list[dict]:
    import torch

    from quantroll.compute import resolve_compute_dtype
    from quantroll.engine import SamplingParams
    from quantroll.evaluation.heldout import score
    from quantroll.evaluation.policy_engine import PolicyEngine
    from quantroll.longsft.quality import fit_new_tokens
    from quantroll.tasks.base import distinct_problems
    from quantroll.tasks.tokenizer import decode, encode
    from quantroll.tasks.trace import FibTraceTask
    from quantroll.trainer.policy import load_policy

    dtype = resolve_compute_dtype(device, "auto")
    policy = load_policy(model, device=device, dtype=dtype)
    policy.eval()
    copy = PolicyEngine(model, device, dtype)
    rows = []
    for length in lengths:
        task = FibTraceTask(length=length, terms=terms)
        partial = FibTraceTask(length=length, terms=terms, partial_credit=True)
        todo = distinct_problems(task, random.Random(f"quantroll-long-study-{seed}-{length}-{terms}"), problems)
        engine = copy.engine_for(policy)
        params = SamplingParams(temperature=1.0, seed=seed,
                                max_new_tokens=fit_new_tokens(engine, todo, task.max_response_tokens + 8))
        scored = score(engine, task, todo, encode, decode, params)
        copy.release()
        entropy_sum, entropy_tokens = 0.0, 0
        with torch.no_grad():
            for p, s in zip(todo, scored):
                prompt = encode(p.prompt)
                ids = torch.tensor([prompt + s.tokens[:-1]], device=device)
                logp = torch.log_softmax(policy(ids)[0, len(prompt) - 1:].float(), dim=-1)
                entropy_sum += float(-(logp.exp() * logp).sum())
                entropy_tokens += len(s.tokens)
        n = len(scored)
        passed = sum(s.right for s in scored) / n
        rows.append({
            "length": length, "terms": terms, "n": n, "pass_rate": passed,
            "pass_rate_se": math.sqrt(passed * (1 - passed) / n),
            "reward_partial": sum(partial.reward(decode(s.tokens), p.label) for p, s in zip(todo, scored)) / n,
            "reference_tokens": sum(s.reference_tokens for s in scored) / n,
            "response_tokens": sum(len(s.tokens) for s in scored) / n,
            "entropy_per_token": entropy_sum / max(entropy_tokens, 1),
            "in_range": LOW <= passed <= HIGH,
        })
        print(_row(rows[-1]), flush=True)
    return rows


HEADER = ("| trace-len | terms | n | ref tokens | response tokens | pass rate (exact reward) | partial-credit reward "
          f"| entropy / token | exact reward in [{LOW}, {HIGH}] |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def _row(r: dict) -> str:
    return (f"| {r['length']} | {r['terms']} | {r['n']} | {r['reference_tokens']:.0f} | {r['response_tokens']:.0f} | "
            f"{r['pass_rate']:.3f} ± {r['pass_rate_se']:.3f} | {r['reward_partial']:.3f} | "
            f"{r['entropy_per_token']:.4g} | {'yes' if r['in_range'] else 'no'} |")


def table(rows: list[dict]) -> str:
    return "\n".join([HEADER, *(_row(r) for r in rows)]) + "\n"


def where() -> dict:
    """The machine and the code a call ran on."""
    try:
        import torch
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        torch_version = torch.__version__
    except ImportError:
        gpu, torch_version = None, None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                    text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit = os.environ.get("LONG_STUDY_COMMIT") or "unknown: no git checkout here (set LONG_STUDY_COMMIT)"
        dirty = None
    return {"gpu": gpu or f"none (CPU: {platform.processor() or platform.machine()})", "torch": torch_version,
            "commit": commit, "uncommitted_changes": dirty, "host": socket.gethostname()}


def record(job: str, file: Path, rc: int, seconds: float, status: str, commands: Path | None) -> dict:
    lines = commands.read_text().splitlines() if commands and commands.is_file() else []
    entry = {"job": job, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
             **where(), "status": status, "rc": rc, "seconds": round(seconds, 1), "commands": lines,
             "overrides": {k: v for k, v in sorted(os.environ.items()) if k.startswith("LONG_STUDY_")}}
    with open(file, "a") as out:
        out.write(json.dumps(entry) + "\n")
    return entry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sample", help="pass rate, rewards and entropy per fib length")
    s.add_argument("--model", required=True)
    s.add_argument("--lengths", required=True, help="comma-separated --trace-len values")
    s.add_argument("--terms", type=int, default=2)
    s.add_argument("--problems", type=int, default=32)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cuda")
    s.add_argument("--json", required=True, help="where the rows go (JSON)")
    r = sub.add_parser("record", help="append what ran where to a job's calls.jsonl")
    r.add_argument("--job", required=True)
    r.add_argument("--file", required=True, type=Path)
    r.add_argument("--rc", required=True, type=int)
    r.add_argument("--seconds", required=True, type=float)
    r.add_argument("--status", required=True, choices=("done", "continue", "failed"))
    r.add_argument("--commands", type=Path, help="a file of the commands the call ran, one a line")
    args = p.parse_args(argv)
    if args.what == "record":
        entry = record(args.job, args.file, args.rc, args.seconds, args.status, args.commands)
        print(f"recorded: {entry['job']} {entry['status']} on {entry['gpu']} at {entry['commit'][:12]}, "
              f"{entry['date']}, {entry['seconds']} s")
        return 0
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        print(f"long_study_sample: --lengths must be comma-separated integers, got {args.lengths!r}", file=sys.stderr)
        return 2
    if not Path(args.model, "config.json").is_file():
        print(f"long_study_sample: --model {args.model} is not a checkpoint directory (no config.json)", file=sys.stderr)
        return 2
    print(HEADER, flush=True)
    rows = sample(args.model, lengths, args.terms, args.problems, args.seed, args.device)
    Path(args.json).write_text(json.dumps({"model": str(args.model), "seed": args.seed, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
