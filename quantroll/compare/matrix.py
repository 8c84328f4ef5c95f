"""The runs a compare is made of: which precisions, modes, corrections, seeds, lengths.

Each ``RunSpec`` becomes one ordinary ``quantroll train`` command line (``train_args``),
so a run of the study can be reproduced, or continued, by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantroll.errors import QuantrollError
from quantroll.formats import FORMAT_NAMES, recipe_args, unified_modes
from quantroll.model.invariant import TESTED_RECIPES

PRECISIONS = ("bf16",) + FORMAT_NAMES
KV_CACHE_DTYPES = ("bf16", "fp8")  # the engine's KV cache; the trainer always attends in its own precision
CORRECTIONS = ("none", "tis", "mask", "r3")
CORRECTION_ARGS = {
    "none": (),
    "tis": ("--use-tis",),
    "mask": ("--use-tis", "--tis-mode", "mask"),
    "r3": ("--use-rollout-routing-replay",),
}
# corrections at sequence / geometric-mean level: named by --groups (groupspec.py), not by --corrections
LEVELED = {"tis-seq": ("--use-tis", "--tis-level", "sequence"), "tis-geo": ("--use-tis", "--tis-level", "geometric"),
           "mask-seq": ("--use-tis", "--tis-mode", "mask", "--tis-level", "sequence"),
           "mask-geo": ("--use-tis", "--tis-mode", "mask", "--tis-level", "geometric")}


@dataclass(frozen=True)
class RunSpec:
    precision: str
    unified: bool
    correction: str
    seed: int
    response_len: int
    sweep: bool = False
    kv_cache_dtype: str = "bf16"
    true_on_policy: bool = False  # --true-on-policy-mode: batch-invariant kernels on both sides
    bf16_exceptions: bool = False  # the engine checkpoint keeps the --bf16-exceptions in BF16 (an opt-in group)

    @property
    def checkpoint_key(self) -> str:
        """Which converted checkpoint the engine loads: the precision, or it with the BF16 exceptions."""
        return f"{self.precision}+bf16x" if self.bf16_exceptions else self.precision

    @property
    def run_id(self) -> str:
        mode = "unified" if self.unified else ("rollout" if self.precision != "bf16" else "baseline")
        kv = "-kvfp8" if self.kv_cache_dtype == "fp8" else ""
        kv += "-bf16x" if self.bf16_exceptions else ""
        tail = f"-len{self.response_len}" if self.sweep else ""
        top = "-top" if self.true_on_policy else ""
        return f"{self.precision}{kv}-{mode}{top}-{self.correction}-seed{self.seed}{tail}"

    def train_args(self) -> list[str]:
        """The flags that make this run what it is (the runner adds checkpoints and output)."""
        args = ["--seed", str(self.seed), "--rollout-max-response-len", str(self.response_len)]
        args += list({**CORRECTION_ARGS, **LEVELED}[self.correction])
        if self.unified:
            args += list(recipe_args(self.precision))  # the format's own train flag
        if self.sweep:
            args += ["--rollout-ignore-eos"]
        if self.kv_cache_dtype == "fp8":
            args += ["--kv-cache-dtype", "fp8_e4m3"]
        if self.true_on_policy:
            args += ["--true-on-policy-mode"]
        return args


def _parse_list(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise QuantrollError(f"{flag} {text!r}: use a comma-separated list of {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def _parse_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise QuantrollError(f"{flag} {text!r}: use a comma-separated list of integers") from None
    if not values:
        raise QuantrollError(f"{flag} is empty")
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:  # was dropped silently: '--seeds 1,1' ran one seed where two were asked for
        raise QuantrollError(f"{flag} {text!r} lists {twice} twice; give each value once")
    return values


def build_matrix(precisions: str, corrections: str, modes: str, seeds: str, response_len: int, moe: bool,
                 sweep_lens: str | None = None, kv_cache_dtypes: str = "bf16", true_on_policy: bool = False,
                 bf16_exceptions: bool = False) -> list[RunSpec]:
    """bf16 runs once per seed (no correction: it is the baseline); every low precision
    with every correction, in mode 1 and in its unified mode when ``modes`` names it;
    ``r3`` joins the corrections for MoE models. Each KV cache dtype of ``kv_cache_dtypes``
    repeats them with that cache (BF16 weights with an FP8 cache is a low-precision
    rollout of its own, with every correction), so a report shows FP8 weights, FP8 KV and
    both apart. Sweep runs (correction none) repeat each of them at every response length.
    ``true_on_policy`` (opt-in) adds the ``true-on-policy`` group: the bf16 baseline and mode 2
    (when the matrix has it) again with --true-on-policy-mode, correction none, BF16 KV cache,
    so that the report shows each one's gap with and without the mode and the mode's cost.
    With ``bf16_exceptions`` every low-precision variant is repeated (all corrections, main
    runs only) on a checkpoint that keeps the BF16 exceptions: a group of its own."""
    precs = _parse_list(precisions, PRECISIONS, "--precisions")
    corrs = _parse_list(corrections, CORRECTIONS, "--corrections")
    unified_of = unified_modes()  # mode number -> the format its trainer's forward runs in (formats' own facts)
    mode_list = _parse_list(modes, ("1",) + tuple(unified_of), "--modes")
    if "r3" in corrs and not moe:
        raise QuantrollError("--corrections r3 (routing replay) needs an MoE model")
    if moe and "r3" not in corrs:
        corrs.append("r3")
    seed_list = _parse_ints(seeds, "--seeds")
    kvs = _parse_list(kv_cache_dtypes, KV_CACHE_DTYPES, "--kv-cache-dtypes")
    variants: list[tuple[str, bool]] = []
    for p in precs:
        if p == "bf16":
            variants.append((p, False))
            continue
        if "1" in mode_list:
            variants.append((p, False))
        if any(unified_of[m] == p for m in mode_list if m != "1"):
            variants.append((p, True))
    if not any(p != "bf16" for p, _ in variants) and len(precs) > 1:
        raise QuantrollError(f"--modes {modes} applies to none of --precisions {precisions}: mode 1 is any low-precision "
                             "rollout with BF16 training, 2/3/4 are unified fp8/mxfp8/nvfp4")
    specs = []
    for kv in kvs:
        for p, unified in variants:
            for c in (["none"] if p == "bf16" and kv == "bf16" else corrs):
                specs += [RunSpec(p, unified, c, s, response_len, kv_cache_dtype=kv) for s in seed_list]
    if true_on_policy:
        for p, unified in variants:
            if p == "bf16" or (unified and p in TESTED_RECIPES):
                specs += [RunSpec(p, unified, "none", s, response_len, true_on_policy=True) for s in seed_list]
    if bf16_exceptions:
        specs += [RunSpec(p, unified, c, s, response_len, kv_cache_dtype=kv, bf16_exceptions=True)
                  for kv in kvs for p, unified in variants if p != "bf16" for c in corrs for s in seed_list]
    for length in (_parse_ints(sweep_lens, "--sweep-response-len") if sweep_lens else []):
        specs += [RunSpec(p, unified, "none", s, length, sweep=True, kv_cache_dtype=kv)
                  for kv in kvs for p, unified in variants for s in seed_list]
    return specs
