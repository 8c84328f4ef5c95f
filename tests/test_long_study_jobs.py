"""bench/long_study.sh, the long-response study's GPU jobs, end to end on the CPU with the tiny
knobs (LONG_STUDY_SMOKE=1: a 1-layer model, ~64-token traces, 2 steps), so that a GPU session
cannot fail on a typo: every job in the order of docs/long-study.md, a job stopped by its
deadline and resumed by the next call (sft mid-run; learn-4k between its compares), a job
continued on a bare machine from the results a call packed, and the report built from it all.
The numbers are not checked here (a 2-step model learns nothing): that the pieces run is."""

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "long_study.sh"


def _job(env: dict, job: str, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), job], cwd=ROOT, env={**env, **extra}, capture_output=True, text=True,
                          timeout=900)


def _ok(p: subprocess.CompletedProcess, code: int = 0) -> str:
    assert p.returncode == code, p.stdout[-4000:] + p.stderr[-2000:]
    return p.stdout


def test_a_wrong_job_is_refused_with_the_usage():
    p = subprocess.run(["bash", str(SCRIPT), "train"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "usage: bash bench/long_study.sh sft|calibrate|gap|learn-4k|learn-16k|report" in p.stderr


def test_a_part_is_not_started_when_the_call_cannot_hold_it(tmp_path):
    """LONG_STUDY_PART_SECONDS replaces the guess of a part's length (the longest part so far, at most half a
    call): a call with less time left than that starts no compare and asks for another call."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LONG_STUDY_SMOKE": "1", "LONG_STUDY_DIR": str(tmp_path / "ls"),
           "OUT": str(tmp_path / "out"), "LONG_STUDY_FIXED": str(tmp_path / "fixed"),
           "LONG_STUDY_CARRIED": str(tmp_path / "none-carried"), "LONG_STUDY_MODEL": str(ROOT / "quantroll/data/fib-qwen3-long")}
    out = _ok(_job(env, "learn-16k", LONG_STUDY_PART_SECONDS="100000", LONG_STUDY_CALL_SECONDS="60"), 75)
    assert re.search(r"learn-bf16-seed1: not started, \d+ s left \(a part needs 100000 s", out)
    assert not (tmp_path / "ls" / "learn-16k" / "compare").exists() and "quantroll compare" not in out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_sample_helpers_entropy_is_the_uniform_distributions_for_a_zero_lm_head(tmp_path, device):
    """Independent reference: zero output weights give uniform logits, whose entropy is ln(vocab)
    (exact in BF16 too: every logit is 0)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from quantroll.builtin import TinyQwen3, write_tiny_qwen3

    model = write_tiny_qwen3(tmp_path / "m", TinyQwen3(num_hidden_layers=1, max_position_embeddings=256), seed=0)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["lm_head.weight"] = torch.zeros_like(tensors["lm_head.weight"])
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "bench/long_study_sample.py", "sample", "--model", str(model), "--lengths",
                        "40,60", "--problems", "3", "--device", device, "--json", str(out)], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["length"] for r in rows] == [40, 60] and all(r["n"] == 3 for r in rows)
    for r in rows:  # float32 softmax of equal logits: exact to ~1e-6
        assert r["entropy_per_token"] == pytest.approx(math.log(128), abs=1e-4)
        assert r["pass_rate"] == 0.0 and r["reward_partial"] == 0.0 and not r["in_range"]
    assert "| 40 | 2 | 3 |" in p.stdout


@pytest.mark.slow
def test_every_job_runs_resumes_and_reports(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "LONG_STUDY_SMOKE": "1",
           "LONG_STUDY_DIR": str(tmp_path / "ls"), "OUT": str(tmp_path / "out"),
           "LONG_STUDY_FIXED": str(tmp_path / "fixed"), "LONG_STUDY_REPORT_DIR": str(tmp_path / "report"),
           "LONG_STUDY_MIN_START": "0", "LONG_STUDY_CARRIED": str(tmp_path / "none-carried")}  # not the tree's
    out, ls = tmp_path / "out", tmp_path / "ls"

    # sft: a deadline at once stops it after one step (exit 75, nothing exported); the next call resumes it
    first = _ok(_job(env, "sft", LONG_STUDY_SFT_TIME_LIMIT="0"), 75)
    assert "stopped at --time-limit after 1 of 2 steps" in first and "not done: call" in first
    assert not (out / "sft-model.tgz").exists() and (out / "sft.tgz").is_file() and (out / "sft.log").is_file()
    second = _ok(_job(env, "sft"))
    assert "resumed after step 0" in second and "long_study sft: done" in second
    model = ls / "sft" / "model"
    sha = hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    recipe = (out / "sft-model.txt").read_text()
    assert f"sha256: {sha}  model.safetensors" in recipe and "seed: 0" in recipe
    assert "--time-limit" not in recipe and "--resume" not in recipe and "--trace-len 48,64" in recipe
    with tarfile.open(out / "sft-model.tgz") as tar:
        assert "model/model.safetensors" in tar.getnames()
    calls = [json.loads(x) for x in (ls / "sft/calls.jsonl").read_text().splitlines()]
    assert [c["status"] for c in calls] == ["continue", "done"] and calls[0]["rc"] == 75
    assert all(c["gpu"].startswith("none (CPU") and c["commit"] and c["date"].endswith("UTC") for c in calls)
    assert calls[1]["commands"][0].startswith("python3 -m quantroll sft --save")

    # the other jobs need the model: refused with the way out until it is given
    refused = _job(env, "calibrate", LONG_STUDY_MODEL=str(tmp_path / "nowhere"))
    assert refused.returncode == 1 and "set LONG_STUDY_MODEL=" in refused.stdout and "calibrate: FAILED" in refused.stdout
    env["LONG_STUDY_MODEL"] = str(model)

    _ok(_job(env, "calibrate"))
    rows = json.loads((ls / "calibrate/calibrate.json").read_text())["rows"]
    assert [r["length"] for r in rows] == [48, 64]
    assert all(0 <= r["pass_rate"] <= 1 and 0 < r["entropy_per_token"] <= math.log(128) + 1e-4 for r in rows)

    _ok(_job(env, "gap"))
    gap = json.loads((ls / "gap/64/compare/summary.json").read_text())
    # the longest length (here the only one) adds a second seed for FP8 KV alone
    assert sorted(r["run_id"] for r in gap["runs"] if r["status"] == "done") == [
        "bf16-baseline-none-seed1", "fp8-kvfp8-rollout-none-seed1", "fp8-kvfp8-rollout-none-seed2",
        "fp8-rollout-none-seed1", "fp8-unified-none-seed1"]
    metrics = (ls / "gap/64/compare/runs/fp8-rollout-none-seed1/metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in metrics] == [0, 1]  # steps 0 and 1
    assert all(json.loads(x)["entropy"] > 0 for x in metrics)  # the gap's entropy, from the runs themselves

    # learn-4k: a call too short for the whole matrix stops between (or inside) compares; the next one finishes
    cut = _ok(_job(env, "learn-4k", LONG_STUDY_CALL_SECONDS="8"), 75)
    assert "not done: call 'bash bench/long_study.sh learn-4k' again" in cut
    _ok(_job(env, "learn-4k"))
    learn = json.loads((ls / "learn-4k/compare/summary.json").read_text())
    assert len([r for r in learn["runs"] if r["status"] == "done"]) == 8 and not learn["failed"]
    # LEARN_JOBS: the learning runs two at a time, each with its own KV pool; the report says the times are shared
    placed = json.loads((ls / "learn-4k/compare/runs/fp8-rollout-tis-seed1/run.json").read_text())["placement"]
    assert placed == {"jobs": 2, "gpu": None, "shared_device": True}
    assert "--kv-cache-memory-gb 0.25" in " ".join(json.loads(
        (ls / "learn-4k/compare/runs/fp8-rollout-tis-seed1/run.json").read_text())["command"])
    assert any("shared their device" in w for w in learn["warnings"])
    assert sorted(g["correction"] for g in learn["groups"]) == ["mask", "none", "none", "none", "tis", "tis-seq"]

    _ok(_job(env, "learn-16k", LONG_STUDY_LEARN_JOBS="2"))  # its default is one at a time
    assert len(json.loads((ls / "learn-16k/compare/summary.json").read_text())["runs"]) == 7
    started = re.findall(r"^\[\d/7\] (\S+)", (ls / "learn-16k/units/learn-all.log").read_text(), re.M)
    assert started[:4] == ["bf16-baseline-none-seed1", "fp8-rollout-none-seed1", "bf16-baseline-none-seed2",
                           "fp8-rollout-none-seed2"]  # the first pair at once: BF16 and FP8, seed 1

    # a bare machine continues from the packed results: finished runs are kept, not redone
    with tarfile.open(out / "learn-16k.tgz") as tar:
        names = tar.getnames()
        assert not any(n.split("/")[-1] == "state" or "/state/" in n or "/compare/checkpoints/" in n for n in names)
        assert "learn-16k/compare/runs/bf16-baseline-none-seed2/metrics.jsonl" in names
        tar.extractall(tmp_path / "packed")
    shutil.rmtree(tmp_path / "packed/learn-16k/units")  # every part and the whole matrix run compare again
    carried = tmp_path / "carried"
    carried.mkdir()
    with tarfile.open(carried / "learn-16k.tgz", "w:gz") as tar:
        tar.add(tmp_path / "packed/learn-16k", arcname="learn-16k")
    # ... and one run at a time there (a call that must finish one run in time): the runs' commands are the
    # same as 2 at once, so none starts again: a compare a run, then the whole matrix
    again = _ok(_job(env, "learn-16k", LONG_STUDY_DIR=str(tmp_path / "bare"), LONG_STUDY_CARRIED=str(carried)))
    assert f"learn-16k: continued from {carried}/learn-16k.tgz" in again
    assert again.count("done earlier, kept") == 7 + 7 and "resuming" not in again

    _ok(_job(env, "report"))
    report = (tmp_path / "report/report.md").read_text()
    for part in ("## What ran where", "## Calibration: the knob", "## The gap at steps 0 and 1, by length",
                 "## Learning runs: learn-4k", "## Learning runs: learn-16k", "Every job left results."):
        assert part in report
    summary = json.loads((tmp_path / "report/summary.json").read_text())
    assert len(summary["gap"]) == 5 and summary["learn"]["learn-16k"]["groups"]
    assert summary["sft"]["task"]["lengths"] == [48, 64]
    assert "<img" in (tmp_path / "report/report.html").read_text()
    assert (tmp_path / "report/plots/gap_vs_length.png").is_file() and (tmp_path / "report/learn-4k/report.md").is_file()
    assert "python3 -m quantroll compare" in (tmp_path / "report/commands.txt").read_text()
    assert (out / "report.tgz").is_file()
