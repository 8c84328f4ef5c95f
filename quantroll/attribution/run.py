"""``quantroll attribute`` from configuration to result: measure, rank, propose, verify.

    batches   = the engine on the full conversion samples responses, per seed
    cheap     = one forward per precision: hidden-state divergence per layer, each linear's
                output error on the BF16 model's own inputs, MoE routing flips
    exact     = ablations per layer, kind and cell (ablate.py)
    proposal  = greedy BF16 exceptions to the target (propose.py), as flags (flagset.py),
                checked against convert's planner
    verified  = those flags through convert, the engine and the trainer on fresh seeds

The result is one JSON-able dict; report.py writes it out.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from quantroll.errors import QuantrollError
from quantroll.formats import format_names


@dataclass(frozen=True)
class AttributeConfig:
    hf_checkpoint: str | None = None  # BF16; None: the built-in model
    builtin_model: str = "dense"
    precision: str = "fp8"
    task: str = "arithmetic"
    digits: int = 2
    prompt_data: str | None = None
    input_key: str = "prompt"
    label_key: str = "label"
    prompts: int = 32
    samples: int = 4
    max_new_tokens: int = 8
    temperature: float = 1.0
    seeds: tuple[int, ...] = (1, 2, 3)
    verify_seeds: tuple[int, ...] = (101, 102, 103)
    target_gap: float | None = None
    target_fraction: float = 0.5
    cheap_only: bool = False
    propose: bool = True  # False: rank only (ablations without the greedy proposal)
    device: str = "cpu"
    compute_dtype: str = "auto"

    def __post_init__(self):
        for flag, value in (("prompts", self.prompts), ("samples", self.samples),
                            ("max-new-tokens", self.max_new_tokens)):
            if value < 1:
                raise QuantrollError(f"--{flag} must be >= 1, got {value}")
        if not self.seeds:
            raise QuantrollError("--seeds is empty; give e.g. 1,2,3")
        if self.precision == "bf16" or self.precision not in format_names():
            raise QuantrollError(f"--precision {self.precision}: attribute a low precision, one of {', '.join(format_names())}")
        # a gap of 0 is reached only with every linear in BF16, which is no low-precision checkpoint at all
        if self.target_gap is not None and not self.target_gap > 0:
            raise QuantrollError(f"--target-gap must be a number > 0, got {self.target_gap}")
        if not 0 < self.target_fraction < 1:
            raise QuantrollError(f"--target-fraction must be in (0, 1), got {self.target_fraction}")
        if not self.temperature > 0:
            raise QuantrollError(f"--temperature must be > 0 (responses are sampled), got {self.temperature}")
        _refuse_ignored_settings(self)
        if set(self.seeds) & set(self.verify_seeds):
            raise QuantrollError("--seeds and --verify-seeds overlap; verification needs seeds the proposal never saw")

    @property
    def sample(self) -> dict:
        return {"prompts": self.prompts, "samples": self.samples, "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature}



def _refuse_ignored_settings(cfg: AttributeConfig) -> None:
    """A setting that the rest of the command line makes moot was ignored silently
    ('--builtin-model moe' beside --hf-checkpoint, '--digits 3' with count or --prompt-data,
    a target or verify seeds with --cheap-only); a value other than its default is refused."""
    default = AttributeConfig.__dataclass_fields__
    moot = []
    if cfg.hf_checkpoint and cfg.builtin_model != default["builtin_model"].default:
        moot.append((f"--builtin-model {cfg.builtin_model}", "--hf-checkpoint is given"))
    if cfg.digits != default["digits"].default and (cfg.prompt_data or cfg.task != "arithmetic"):
        moot.append((f"--digits {cfg.digits}", "--prompt-data is given" if cfg.prompt_data else f"--task is {cfg.task}"))
    if cfg.prompt_data and cfg.task != default["task"].default:
        moot.append((f"--task {cfg.task}", "--prompt-data is given"))
    if cfg.cheap_only:
        if cfg.target_gap is not None or cfg.target_fraction != default["target_fraction"].default:
            moot.append(("--target-gap/--target-fraction", "--cheap-only makes no proposal"))
        if cfg.verify_seeds != default["verify_seeds"].default and cfg.verify_seeds:
            moot.append(("--verify-seeds", "--cheap-only makes no proposal to verify"))
    if moot:
        flag, why = moot[0]
        raise QuantrollError(f"{flag} is ignored because {why}; drop it")

def source_of(cfg: AttributeConfig) -> tuple[Path, str]:
    from quantroll.builtin import builtin_checkpoint
    from quantroll.trainer.policy import refuse_quantized

    if cfg.hf_checkpoint:
        path = Path(cfg.hf_checkpoint)
        refuse_quantized(path, "--hf-checkpoint")
        return path, str(path)
    return builtin_checkpoint(cfg.builtin_model), f"built-in tiny Qwen3 ({cfg.builtin_model}, warm-started)"


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="pass", disable=None if enabled else True, leave=False)


def run_attribution(cfg: AttributeConfig, log=print, progress: bool = True) -> dict:
    import torch

    from quantroll.attribution.ablate import ablate, ranking, units
    from quantroll.attribution.flagset import kept_modules, render
    from quantroll.attribution.hybrid import Hybrid
    from quantroll.attribution.measure import Measurer
    from quantroll.attribution.propose import bf16_bytes, greedy, weight_bytes
    from quantroll.attribution.sampling import draw_batch
    from quantroll.attribution.units import cell_name, cells_of
    from quantroll.attribution.verify import verify
    from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
    from quantroll.checkpoint.reader import CheckpointReader
    from quantroll.compare.stats import stats
    from quantroll.compute import resolve_compute_dtype
    from quantroll.engine import Engine
    from quantroll.model.loader import load_model
    from quantroll.rl.loop import _tokenizer
    from quantroll.rl.rollout import make_task

    source, label = source_of(cfg)
    task = make_task(cfg.task, cfg.digits, prompt_data=cfg.prompt_data, input_key=cfg.input_key,
                     label_key=cfg.label_key)
    tokenizer = _tokenizer(source)
    if cfg.prompt_data:
        from quantroll.tasks.data import check_vocabulary

        check_vocabulary(task.problems, tokenizer, "--prompt-data")
    dtype = resolve_compute_dtype(cfg.device, cfg.compute_dtype)
    torch.manual_seed(0)
    with CheckpointReader(source) as reader:
        shapes = {n: i.shape for n, i in reader.tensors.items()}
    with tempfile.TemporaryDirectory(prefix="quantroll-attribute-") as tmp:
        converted_dir = Path(tmp) / cfg.precision
        log(f"attribute: {label}, {cfg.precision} rollout ({cfg.device}); converting")
        convert_checkpoint(source, converted_dir, ConvertConfig(format=cfg.precision, force=True, progress=False))
        bf16, _ = load_model(source, cfg.device, dtype)
        converted, _ = load_model(converted_dir, cfg.device, dtype)
        engine = Engine(converted_dir, device=cfg.device, dtype=dtype)
        precision_label = engine.precision
        log(f"sampling {cfg.prompts} prompts x {cfg.samples} per seed, seeds {','.join(map(str, cfg.seeds))}")
        batches = [draw_batch(engine, tokenizer, task, s, **cfg.sample) for s in cfg.seeds]
        del engine
    hybrid = Hybrid(bf16, converted)
    m = Measurer(hybrid, batches, cfg.temperature)
    cells = cells_of(hybrid.quantized)
    num_layers = bf16.config.num_hidden_layers
    full = m.gap(m.all_modules)
    cheap = m.cheap()
    result = {
        "config": asdict(cfg), "model": label, "source": str(source), "precision": cfg.precision,
        "precision_label": precision_label, "moe": m.moe, "num_layers": num_layers,
        "cells": [[c[0], c[1]] for c in cells], "tokens_per_seed": [int(sum(len(r) for r in b.responses)) for b in batches],
        "gap_full": stats(full), "gap_full_per_seed": full, "gap_engine": stats(m.engine_gap()),
        "cheap": {"hidden_divergence": cheap.hidden_divergence,
                  "local_error": [{"cell": list(c), "name": cell_name(c), "value": v} for c, v in cheap.local_error.items()],
                  "layer_local_error": {str(k): v for k, v in cheap.layer_local_error.items()},
                  "routing_flips": {str(k): v for k, v in cheap.routing_flips.items()}},
        "cheap_rank_layers": [int(k) for k, _ in sorted(cheap.layer_local_error.items(), key=lambda kv: -kv[1])],
    }
    if cfg.cheap_only:
        result["forwards"] = m.forwards
        return result
    n_units = len(units(cells, m.moe)) + (1 if m.moe else 0)
    bar = _bar(n_units, "ablations", progress)
    try:
        contributions = ablate(m, cells, bar.update)
    finally:
        bar.close()
    result["contributions"] = [c.to_json() for c in contributions]
    result["rank_layers"] = [c.key for c in ranking(contributions, "layer")]
    result["rank_kinds"] = [c.key for c in ranking(contributions, "kind")]
    result["rank_cells"] = [list(c.key) for c in ranking(contributions, "cell")]

    if not cfg.propose:
        result["forwards"] = m.forwards
        return result
    target = cfg.target_gap if cfg.target_gap is not None else cfg.target_fraction * stats(full)["mean"]
    cost = {c: sum(bf16_bytes(hybrid.quantized[n]) for n in ms) for c, ms in cells.items()}

    def gap_keeping(kept) -> float:
        keep = {n for c in kept for n in cells[c]}
        return stats(m.gap(m.all_modules - keep))["mean"]

    log(f"proposal: greedy BF16 exceptions to a gap <= {target:.4g} (full conversion: {stats(full)['mean']:.4g})")
    bar = _bar(len(cells) * (len(cells) + 1) // 2, "proposal", progress)
    try:
        steps, _ = greedy(list(cells), gap_keeping, target, cost, bar.update)
    finally:
        bar.close()
    kept = {s.cell for s in steps}
    flags = render(kept, set(cells), num_layers)
    kept_names = {n for c in kept for n in cells[c]}
    planned = kept_modules(flags, shapes, cfg.precision, num_layers) & m.all_modules
    if planned != kept_names:  # the flags would not keep what was measured: a bug here, not the user's
        raise RuntimeError(f"flag set {flags.text()!r} keeps {sorted(planned ^ kept_names)[:3]} differently "
                           "from the proposal")
    bf16_total = sum(cost[c] for c in kept)
    lp_total = sum(weight_bytes(hybrid.quantized[n]) for n in kept_names)
    all_lp = sum(weight_bytes(q) for q in hybrid.quantized.values())
    kept_gap = m.gap(m.all_modules - kept_names)
    result["proposal"] = {
        "target": target, "target_rule": (f"--target-gap {cfg.target_gap}" if cfg.target_gap is not None
                                          else f"--target-fraction {cfg.target_fraction} of the full gap"),
        "reached": stats(kept_gap)["mean"] <= target, "cells": [list(c) for c in sorted(kept)],
        "names": [cell_name(s.cell) for s in steps], "steps": [s.to_json() for s in steps],
        "gap": stats(kept_gap), "gap_per_seed": kept_gap, "flags": flags.args(), "flags_text": flags.text(),
        "bf16_bytes": bf16_total, "extra_bytes": bf16_total - lp_total, "linear_bytes_low_precision": all_lp,
        "extra_share": (bf16_total - lp_total) / all_lp if all_lp else 0.0,
    }
    if kept == set(cells):  # convert refuses such flags: nothing to verify or to use, but the measurements stand
        result["proposal"]["unreachable"] = (
            f"no BF16 exceptions short of keeping every linear in BF16 bring the gap under {target:.4g} "
            f"({result['proposal']['target_rule']}); the measurements are in the report: raise the target")
    elif cfg.verify_seeds and kept:
        log(f"verifying {flags.text() or '(nothing kept)'} through convert + engine on seeds "
            f"{','.join(map(str, cfg.verify_seeds))}")
        checked = verify(source, cfg.precision, flags, bf16, tokenizer, task, cfg.verify_seeds, cfg.sample,
                         cfg.device, dtype)
        converted_kept = set(checked.pop("kept_modules")) & m.all_modules
        if converted_kept != kept_names:
            raise RuntimeError("convert with the proposed flags kept other modules than the proposal")
        result["verification"] = checked
    result["forwards"] = m.forwards
    return result
