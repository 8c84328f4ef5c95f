"""The comparisons of a multi-process result with one process's (shared by the torchrun
and the Ray tests)."""

from __future__ import annotations

import functools
import json
import multiprocessing
from pathlib import Path

import torch

from quantroll.rl.placement import OneProcess
from tests.dist import scenarios

REL = 1e-5


def rel(a: float, b: float, floor: float = 1e-12) -> float:
    return abs(a - b) / max(abs(a), abs(b), floor)


# A policy loss at ratio 1 is the token mean of advantages that sum to ~0 over each group:
# its float32 value is a cancelled sum (1e-9 where the terms are O(1)), so a loss is
# compared relative to at least this much; the gradient norms and weights carry no floor.
LOSS_FLOOR = 1e-3


def tensor_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b| (per tensor: an elementwise ratio explodes near zero)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def load(out: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    tensors = load_file(str(out / "tensors.safetensors"))
    if (out / "engine-tensors.safetensors").exists():  # an engine rank's own (engines on ranks of their own)
        tensors.update(load_file(str(out / "engine-tensors.safetensors")))
    return json.loads((out / "results.json").read_text()), tensors


def _fresh(fn, *args):
    """``fn(*args)`` in a fresh interpreter (spawned), as every rank starts: in the pytest
    process, after other tests, the step-0 loss of the one-process reference (a cancelled
    sum near 0, compared within 1e-8) once came out -1.3e-5 where every fresh process gives
    7.45e-9, whatever its number of threads; the cause inside the long-lived process was
    not found."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def _train(name: str) -> dict:
    return scenarios.train_case(OneProcess(), name)


def _generate(engine_dir: Path) -> dict:
    return scenarios.generate_case(OneProcess(), engine_dir)


def _sync(engine_dir: Path, check: bool) -> dict:
    return scenarios.sync_case(OneProcess(), engine_dir, check)


# one-process references, computed once per test session (the 2-rank, 4-rank and Ray runs share them)
@functools.cache
def _train_ref(name: str) -> dict:
    return _fresh(_train, name)


@functools.cache
def _generate_ref(engine_dir: Path) -> dict:
    return _fresh(_generate, engine_dir)


@functools.cache
def _sync_ref(engine_dir: Path, check: bool) -> dict:
    return _fresh(_sync, engine_dir, check)


def check_training(results: dict, tensors: dict, name: str) -> None:
    ref = _train_ref(name)
    got = results[f"train/{name}"]
    for step, (a, b) in enumerate(zip(got["losses"], ref["losses"])):
        assert rel(a, b, LOSS_FLOOR) <= REL, f"{name} step {step}: loss {a} vs one process {b}"
    for step, (a, b) in enumerate(zip(got["grad_norms"], ref["grad_norms"])):
        assert rel(a, b) <= REL, f"{name} step {step}: grad norm {a} vs one process {b}"
    for i, m in enumerate(ref["masters"]):
        d = tensor_rel(tensors[f"train/{name}/master/{i}"], m)
        assert d <= REL, f"{name}: FP32 master {i} differs by {d:.3g} (relative) from one process's"
    masters = {n: m.detach() for n, m in zip(ref["weights"], ref["masters"])}
    for n, w in ref["weights"].items():
        mine, w = tensors[f"train/{name}/weight/{n}"], w.detach()
        differ = mine != w
        if differ.any():  # a BF16 rounding may flip only where the master sits at the midpoint of two BF16 values
            mid = (mine[differ].double() + w[differ].double()) / 2
            tol = REL * masters[n].abs().max().item()
            assert bool(((masters[n][differ].double() - mid).abs() <= tol).all()), \
                f"{name}: BF16 weight {n} differs away from a rounding midpoint"


def check_generation(results: dict, engine_dir: Path) -> None:
    ref = _generate_ref(Path(engine_dir))
    for label in ("greedy", "sampled"):
        for i, ((tokens, lps, reason), (rt, rl, rr)) in enumerate(zip(results["generate"][label], ref[label])):
            assert tokens == rt and reason == rr, f"{label} prompt {i}: {tokens} vs one engine's {rt}"
            # the tokens must be identical; the logprobs carry the rounding of GEMMs whose blocking depends on
            # the batch's size (an engine of 3 prompts against one of 10), ~1e-5 after 4 float32 layers
            worst = max((abs(a - b) for a, b in zip(lps, rl)), default=0.0)
            assert worst <= 1e-4, f"{label} prompt {i}: logprobs differ by {worst:.3g}"


def check_sync(results: dict, tensors: dict, label: str, engine_dir: Path, check: bool) -> None:
    got = results[f"sync/{label}"]
    assert len(set(got["digests"])) == 1, f"{label}: the engines differ after the broadcast: {got['digests']}"
    ref = _sync_ref(Path(engine_dir), check)
    assert got["version"] == ref["version"]
    for n, t in ref["state"].items():
        mine = tensors[f"sync/{label}/{n}"]
        assert mine.dtype == t.dtype and torch.equal(mine.view(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), \
            f"{label}: {n} is not bitwise equal to the one-process sync's"
    if check:
        assert got["check_worst"] == 0.0
    timing = got["timing"]
    assert 0 < timing["weight_update_bytes"] < timing["weight_update_bf16_bytes"]
