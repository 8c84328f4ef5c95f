"""Supervised warm start of the built-in tiny Qwen3 on a built-in task.

A random model never gets an exact-match reward, so RL from it has nothing to learn
from. ``warm_start`` trains one briefly on (prompt, answer) pairs of a task until it is
right some of the time but far from always, and exports it as an HF BF16 checkpoint:
the default model that ``quantroll train`` improves with RL.

Each example is ``prompt + answer + EOS`` in character tokens (tasks/tokenizer.py);
the loss is the token-mean cross-entropy over the answer and EOS tokens only (the
prompt is given, never predicted). Greedy exact-match accuracy is measured with the
rollout engine on held-out problems (never trained on), before and after, on the
exported BF16 checkpoint itself.

Training and the accuracy checks compute by the one rule every command follows
(quantroll/compute.py): float32 by default on CPU, since BF16 matmuls on a CPU without
native BF16 instructions (AVX2 only) run 10-100x slower and would make the warm start
take an hour, and so that the accuracy recorded here is what ``generate`` and the RL
loop see on the same machine. The exported weights are BF16 either way.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from quantroll.builtin import TinyQwen3, write_tiny_qwen3
from quantroll.errors import QuantrollError
from quantroll.tasks.arithmetic import ArithmeticTask
from quantroll.tasks.base import Problem, Task, held_out_problems, training_problems  # noqa: F401 (users' names)
from quantroll.tasks.tokenizer import EOS, PAD, char_vocab, decode, encode  # noqa: F401
from quantroll.trainer.export import save_hf_checkpoint
from quantroll.trainer.optimizer import MasterWeightAdamW
from quantroll.trainer.policy import load_policy

IGNORE = -100  # label of a position that is not trained on

# The default recipe. Measured for the shipped models (head_dim 128; seed 0, 2-digit +/-, on
# a 2-core AVX2 CPU shared with other jobs): dense reached the target at step 800 (187 s of
# training), 47.7% greedy accuracy on 256 held-out problems (0% before); MoE did not reach it
# by step 1000 (2093 s), 40.6%. Accuracy rises steeply once carries are learned, hence the
# stop at a target, not a step count.
WARM_START_SHAPE = TinyQwen3()
DEFAULT_STEPS = 1000
DEFAULT_BATCH_SIZE = 64
DEFAULT_LR = 2e-3
DEFAULT_WARMUP = 30
DEFAULT_SEED = 0
DEFAULT_EVAL_SIZE = 256
DEFAULT_TARGET_ACCURACY = 0.5
DEFAULT_CHECK_EVERY = 10
DEFAULT_VAL_SIZE = 128
STATS_FILE = "quantroll_sft.json"

_VOCAB = char_vocab()


# -- tokens ---------------------------------------------------------------------------
def sft_example(problem: Problem) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids = answer ids + EOS)."""
    return encode(problem.prompt), encode(problem.label) + [_VOCAB[EOS]]


def build_batch(examples: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, L], labels [B, L]) for next-token prediction on ``prompt + target``.

    Row b's input is ``(prompt + target)[:-1]`` right-padded with PAD; ``labels[b, j]``
    is the token input position j predicts when that token is part of the target
    (answer or EOS), else IGNORE (prompt tokens and padding)."""
    length = max(len(p) + len(t) - 1 for p, t in examples)
    ids = torch.full((len(examples), length), _VOCAB[PAD], dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE, dtype=torch.long)
    for b, (prompt, target) in enumerate(examples):
        if not prompt or not target:
            raise QuantrollError("an SFT example needs a non-empty prompt and target")
        seq = prompt + target
        ids[b, : len(seq) - 1] = torch.tensor(seq[:-1])
        labels[b, len(prompt) - 1: len(seq) - 1] = torch.tensor(target)
    return ids, labels


def sft_loss(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy (float32) over the labelled positions of the batch."""
    logits = model(ids).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def lr_at(step: int, steps: int, lr: float, warmup: int, schedule: str) -> float:
    """Linear warmup over ``warmup`` steps, then constant or cosine decay to 10% of lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    if schedule != "cosine":
        raise QuantrollError(f"unknown lr schedule {schedule!r}; use cosine or constant")
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# -- evaluation -------------------------------------------------------------------------
def greedy_accuracy(engine, task: Task, problems: list[Problem], batch_size: int = 128) -> float:
    """Fraction of ``problems`` the engine answers exactly (task.reward) with greedy decoding."""
    from quantroll.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=max(len(p.label) for p in problems) + 2)
    total = 0.0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i: i + batch_size]
        results = engine.generate([encode(p.prompt) for p in chunk], params)
        total += sum(task.reward(decode(r.tokens), p.label) for r, p in zip(results, chunk))
    return total / len(problems)


@torch.no_grad()
def teacher_forced_correct(model: torch.nn.Module, problems: list[Problem], batch_size: int = 256) -> torch.Tensor:
    """Per problem, whether the argmax at every answer and EOS position of ``prompt +
    answer + EOS`` is the right token: exactly when greedy decoding writes the answer
    and stops (one forward pass instead of a decode loop; ties aside, the same as
    greedy exact match in the model's own precision)."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(problems), batch_size):
        ids, labels = build_batch([sft_example(p) for p in problems[i: i + batch_size]])
        ids, labels = ids.to(device), labels.to(device)
        right = (model(ids).argmax(-1) == labels) | (labels == IGNORE)
        out.append(right.all(-1).cpu())
    return torch.cat(out)


# -- training ---------------------------------------------------------------------------
def train_sft(model: torch.nn.Module, task: Task, steps: int, batch_size: int, lr: float, seed: int = 0, *,
              exclude: set[str] = frozenset(), warmup: int = DEFAULT_WARMUP, schedule: str = "cosine",
              max_grad_norm: float = 1.0, weight_decay: float = 0.0, progress: bool = True,
              stop_when: Callable[[int], bool] | None = None, check_every: int = 25) -> list[float]:
    """Train ``model`` in place for up to ``steps`` steps (the lr schedule spans ``steps``);
    after every ``check_every`` steps ``stop_when(steps_done)`` may end training early.
    Returns the loss of each step run."""
    if steps < 1 or batch_size < 1 or lr <= 0:
        raise QuantrollError(f"SFT needs steps >= 1, batch size >= 1 and lr > 0 (got {steps}, {batch_size}, {lr})")
    from tqdm import tqdm

    device = next(model.parameters()).device
    rng = random.Random(f"quantroll-sft-train-{seed}")
    opt = MasterWeightAdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay,
                            weight_dtype=None)  # exported to BF16 once, at the end
    model.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc="sft", unit="step", disable=None if progress else True)
    for step in bar:
        for group in opt.inner.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup, schedule)
        ids, labels = build_batch([sft_example(p) for p in training_problems(task, rng, batch_size, exclude)])
        opt.zero_grad()
        loss = sft_loss(model, ids.to(device), labels.to(device))
        if not torch.isfinite(loss):
            raise QuantrollError(f"SFT loss became {loss.item()} at step {step}; lower --lr")
        loss.backward()
        opt.step(max_grad_norm)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if stop_when is not None and (step + 1) % check_every == 0 and step + 1 < steps:
            model.eval()
            stop = stop_when(step + 1)
            model.train()
            if stop:
                break
    bar.close()
    model.eval()
    return losses


def warm_start(out_dir: str | Path, task: Task = ArithmeticTask(), steps: int = DEFAULT_STEPS,
               batch_size: int = DEFAULT_BATCH_SIZE, lr: float = DEFAULT_LR, seed: int = DEFAULT_SEED,
               shape: TinyQwen3 = WARM_START_SHAPE, progress: bool = True, *, eval_size: int = DEFAULT_EVAL_SIZE,
               target_accuracy: float | None = DEFAULT_TARGET_ACCURACY, check_every: int = DEFAULT_CHECK_EVERY,
               val_size: int = DEFAULT_VAL_SIZE, schedule: str = "cosine", device: str = "cpu",
               compute_dtype: str = "auto", force: bool = False, what: str | None = None) -> dict:
    """Make the random tiny Qwen3 (``write_tiny_qwen3(shape, seed)``), train it on ``task``,
    export it to ``out_dir`` (HF BF16) and return the stats, which are also written to
    ``out_dir/quantroll_sft.json``. An existing ``out_dir`` is replaced only with ``force``
    and only when quantroll wrote all of it (quantroll/outputs.py), which is checked
    before training as well as at the export; ``what`` names it in messages.

    Training stops after ``steps`` steps, or earlier once the exact-match accuracy on
    ``val_size`` validation problems (teacher-forced argmax, checked every
    ``check_every`` steps) reaches ``target_accuracy`` (None: never): the model should answer often enough
    that RL gets rewards, and seldom enough that RL has something left to learn.
    Accuracy before and after is measured on ``eval_size`` other held-out problems;
    neither set is ever trained on. ``compute_dtype``: what training and the engine's
    accuracy checks compute in (quantroll/compute.py; auto: float32 on CPU, BF16 on GPU)."""
    from quantroll.compute import resolve_compute_dtype
    from quantroll.outputs import check_replace

    what = what or f"output directory {out_dir}"
    check_replace(what, out_dir, force)
    train_dtype = resolve_compute_dtype(device, compute_dtype)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    held_out = held_out_problems(task, eval_size + (val_size if target_accuracy is not None else 0), seed)
    evaluation, validation = held_out[:eval_size], held_out[eval_size:]
    history: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory(prefix="quantroll-sft-") as tmp:
        init = write_tiny_qwen3(Path(tmp) / "init", shape, seed)
        from quantroll.engine import Engine

        acc_before = greedy_accuracy(Engine(init, device=device, dtype=train_dtype), task, evaluation)
        model = load_policy(init, device=device, dtype=train_dtype)

        def reached_target(step: int) -> bool:
            history.append((step, teacher_forced_correct(model, validation).float().mean().item()))
            return history[-1][1] >= target_accuracy

        t_train = time.perf_counter()
        losses = train_sft(model, task, steps, batch_size, lr, seed, exclude={p.prompt for p in held_out},
                           schedule=schedule, progress=progress, check_every=check_every,
                           stop_when=reached_target if target_accuracy is not None and validation else None)
        train_s = time.perf_counter() - t_train
        trained = save_hf_checkpoint(model, init, Path(tmp) / "trained")
        acc_after = greedy_accuracy(Engine(trained, device=device, dtype=train_dtype), task, evaluation)
        task_fields = {k: v for k, v in asdict(task).items() if k != "name"} if is_dataclass(task) else {}
        stats = {
            "task": {"name": task.name, **task_fields}, "shape": asdict(shape),
            "steps": steps, "steps_run": len(losses), "batch_size": batch_size, "lr": lr, "schedule": schedule,
            "warmup": DEFAULT_WARMUP, "seed": seed, "train_dtype": str(train_dtype).replace("torch.", ""),
            "target_accuracy": target_accuracy, "validation": [{"step": s, "accuracy": a} for s, a in history],
            "eval_size": len(evaluation), "accuracy_before": acc_before, "accuracy_after": acc_after,
            "loss_first": losses[0], "loss_last": sum(losses[-20:]) / len(losses[-20:]),
            "train_seconds": round(train_s, 1), "total_seconds": round(time.perf_counter() - t0, 1),
        }
        save_hf_checkpoint(model, init, out_dir, extra_files={STATS_FILE: json.dumps(stats, indent=2) + "\n"},
                           force=force, what=what)
    return stats
