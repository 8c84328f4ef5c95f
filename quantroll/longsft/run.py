"""The long SFT run: init (or resume), token-sized steps with accumulation, quality
checks on sampled traces, periodic state, export.

A run keeps its state directory (``state_dir``): ``init/`` (the seeded random
checkpoint it started from, which the engine copy and the export are built on) and
``state/`` (state.py). ``resume=True`` continues from the last saved step; without it an
existing state is refused, never overwritten, so a run is not lost to a forgotten flag.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from quantroll.builtin import TinyQwen3, write_tiny_qwen3
from quantroll.checkpoint.atomic import atomic_directory
from quantroll.errors import QuantrollError
from quantroll.evaluation.heldout import greedy, score, summarize
from quantroll.evaluation.policy_engine import PolicyEngine
from quantroll.longsft import state
from quantroll.longsft.batches import micro_batches, step_examples
from quantroll.longsft.quality import fit_new_tokens, nll_by_length, sampled_quality
from quantroll.longsft.shapes import parameter_count
from quantroll.sft import IGNORE, STATS_FILE, build_batch, held_out_problems, lr_at
from quantroll.tasks.base import Task
from quantroll.tasks.tokenizer import decode, encode
from quantroll.trainer.export import save_hf_checkpoint
from quantroll.trainer.optimizer import MasterWeightAdamW
from quantroll.trainer.policy import load_policy


@dataclass(frozen=True)
class LongSFTConfig:
    steps: int = 2000  # the lr schedule's length; the stop rule may end the run sooner
    tokens_per_batch: int = 65536  # tokens (prompt + answer + EOS) per optimizer step
    micro_batch_tokens: int = 32768  # positions per forward, padding included (a 16K trace is up to 19.7K)
    lr: float = 2e-3
    warmup: int = 30
    schedule: str = "cosine"
    max_grad_norm: float = 1.0
    seed: int = 0
    save_every: int = 50  # training state every N steps (0: never)
    check_every: int = 50  # quality check every N steps (0: never)
    val_size: int = 32  # held-out problems of the quality check
    eval_size: int = 64  # held-out problems of the greedy accuracy before and after
    target_pass_rate: float | None = 0.5  # stop once the sampled pass rate reaches it (None: run every step)
    temperature: float = 1.0  # the quality check's sampling temperature (the rollout's)

    def __post_init__(self):
        for name in ("steps", "tokens_per_batch", "micro_batch_tokens", "val_size", "eval_size"):
            if getattr(self, name) < 1:
                raise QuantrollError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("save_every", "check_every", "warmup"):
            if getattr(self, name) < 0:
                raise QuantrollError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise QuantrollError(f"--lr must be > 0, got {self.lr}")
        if self.target_pass_rate is not None and not 0 < self.target_pass_rate <= 1:
            raise QuantrollError(f"--target-pass-rate must be in (0, 1], got {self.target_pass_rate}")
        if not self.temperature > 0:
            raise QuantrollError(f"the quality check samples: its temperature must be > 0, got {self.temperature}")


def _recipe(task: Task, shape: TinyQwen3, cfg: LongSFTConfig) -> dict:
    fields = {k: v for k, v in asdict(task).items() if k != "name"} if is_dataclass(task) else {}
    recipe = {"task": {"name": task.name, **fields}, "shape": asdict(shape), **asdict(cfg)}
    return json.loads(json.dumps(recipe))  # as the saved state reads it back (tuples as lists), for --resume's check


def _step(model, opt: MasterWeightAdamW, examples, micro_tokens: int, device) -> float:
    """One optimizer step's gradients over ``examples``: each micro-batch's summed cross-entropy
    divided by the step's target tokens, accumulated; returns the step's token-mean loss."""
    targets = sum(len(t) for _, t in examples)
    total = 0.0
    for batch in micro_batches(examples, micro_tokens):
        ids, labels = build_batch(batch)
        logits = model(ids.to(device)).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.to(device).reshape(-1),
                               ignore_index=IGNORE, reduction="sum")
        (loss / targets).backward()
        opt.accumulate()
        total += loss.item()
    return total / targets


def long_sft(out_dir: str | Path, task: Task, shape: TinyQwen3, cfg: LongSFTConfig, state_dir: str | Path, *,
             resume: bool = False, device: str = "cpu", compute_dtype: str = "auto", log: Callable[[str], None] = print,
             on_step: Callable[[int, float], None] | None = None, force: bool = False,
             what: str | None = None, deadline: float | None = None) -> dict:
    """Train a model of ``shape`` on ``task`` and export it to ``out_dir`` (HF BF16, with the
    stats in quantroll_sft.json, which are also returned). ``on_step(step, loss)`` is called
    after every step (progress; an exception there stops the run as a kill would).

    ``deadline`` (a ``time.monotonic()`` value): once a step ends past it, before the stop
    rule or ``cfg.steps`` ends the run, the state is saved and the run returns
    ``{"stopped_by": "time_limit", "last_step", "steps_run"}`` without exporting, to be
    continued with ``resume=True`` (a job of a few minutes per call, bench/long_study.sh).
    It is not part of the recipe: each call of one run may have its own."""
    from quantroll.compute import resolve_compute_dtype

    dtype = resolve_compute_dtype(device, compute_dtype)
    state_dir = Path(state_dir)
    recipe = _recipe(task, shape, cfg)
    if state.exists(state_dir) and not resume:
        raise QuantrollError(f"{state_dir} holds a saved SFT state; pass --resume to continue it or choose another "
                             "--state-dir")
    if resume and not state.exists(state_dir):
        raise QuantrollError(f"--resume: no saved SFT state in {state_dir}; run without --resume to start one")
    longest = getattr(task, "max_response_tokens", None)
    if longest is not None and longest + 64 > shape.max_position_embeddings:
        raise QuantrollError(f"the task's longest answers ({longest} tokens) do not fit the shape's context of "
                             f"{shape.max_position_embeddings} positions with their prompt; raise --context")
    init = state_dir / "init"
    if not resume:  # whole or not at all, so that a resumed run finds the init it started from
        with atomic_directory(init, force=True) as tmp:
            write_tiny_qwen3(tmp, shape, cfg.seed)
    torch.manual_seed(cfg.seed)
    held_out = held_out_problems(task, cfg.eval_size + cfg.val_size, cfg.seed)
    evaluation, validation = held_out[: cfg.eval_size], held_out[cfg.eval_size:]
    exclude = {p.prompt for p in held_out}
    model = load_policy(init, device=device, dtype=dtype)
    opt = MasterWeightAdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_dtype=None)
    copy = PolicyEngine(init, device, dtype)
    first, losses, checks, before = 0, [], [], None
    if resume:
        last, losses, checks, before = state.load(state_dir, opt, recipe)
        first = last + 1
        log(f"resumed after step {last} from {state_dir / state.STATE}")
    greedy_len = fit_new_tokens(copy.engine, evaluation, max(len(encode(p.label)) for p in evaluation) + 8)

    def accuracy() -> dict:
        model.eval()
        s = summarize(score(copy.engine_for(model), task, evaluation, encode, decode, greedy(greedy_len)))
        copy.release()
        model.train()
        return s

    if first == 0:
        before = accuracy()
    t0 = time.perf_counter()
    stopped = False
    model.train()
    for step in range(first, cfg.steps):
        for group in opt.inner.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup, cfg.schedule)
        opt.zero_grad()
        loss = _step(model, opt, step_examples(task, cfg.seed, step, cfg.tokens_per_batch, exclude),
                     cfg.micro_batch_tokens, device)
        if loss != loss or loss in (float("inf"), float("-inf")):
            raise QuantrollError(f"SFT loss became {loss} at step {step}; lower --lr")
        opt.step(cfg.max_grad_norm)
        losses.append(loss)
        done = step + 1
        if cfg.check_every and done % cfg.check_every == 0 and done < cfg.steps:
            model.eval()
            quality = {"step": done, **nll_by_length(model, validation, cfg.micro_batch_tokens)}
            quality["sampled"] = sampled_quality(copy.engine_for(model), task, validation, cfg.temperature,
                                                 seed=cfg.seed * 1_000_003 + done)
            copy.release()
            model.train()
            checks.append(quality)
            log(f"step {done}: loss {loss:.4g}, per-token NLL {quality['nll']:.3g}, sampled pass rate "
                f"{quality['sampled']['pass_rate']:.1%} " + " ".join(
                    f"[{b}: {v['pass_rate']:.0%}]" for b, v in quality["sampled"]["by_len"].items()))
            stopped = cfg.target_pass_rate is not None and quality["sampled"]["pass_rate"] >= cfg.target_pass_rate
        if cfg.save_every and (done % cfg.save_every == 0 or stopped):
            state.save(state_dir, opt, step, losses, checks, recipe, before)
        if on_step is not None:
            on_step(step, loss)
        if stopped:
            break
        if deadline is not None and time.monotonic() >= deadline and done < cfg.steps:
            if not (cfg.save_every and done % cfg.save_every == 0):
                state.save(state_dir, opt, step, losses, checks, recipe, before)
            log(f"time limit reached after step {step}: state saved in {state_dir / state.STATE}; "
                "rerun with --resume to continue")
            return {"stopped_by": "time_limit", "last_step": step, "steps_run": len(losses),
                    "resumed_at": first or None}
    model.eval()
    after = accuracy()
    stats = {
        **recipe, "parameters": parameter_count(shape), "steps_run": len(losses), "resumed_at": first or None,
        "train_dtype": str(dtype).replace("torch.", ""), "eval_size": len(evaluation),
        "greedy_before": before, "greedy_after": after, "checks": checks, "losses": losses,
        "train_seconds_this_process": round(time.perf_counter() - t0, 1),
        "stopped_by": "target_pass_rate" if stopped else "steps",
    }
    save_hf_checkpoint(model, init, out_dir, extra_files={STATS_FILE: json.dumps(stats, indent=2) + "\n"},
                       force=force, what=what)
    return stats
