"""Which tensors to quantize and which to keep in BF16, decided from names and shapes.

One function, ``plan``, used by ``convert`` and, later, by the weight sync, so that a
weight update re-quantizes exactly the tensors the checkpoint quantized. It reads no
weights: names and shapes decide everything.

Kept in their source precision (normally BF16), with the reason recorded:
  embedding, lm_head, norm,  by name alone: bf16_rule.py, the one statement of that rule
  router                     (the model builder asks it too)
  not-2d                     anything that is not a 2-D [out, in] weight
  skip-pattern               the user's --skip patterns
  first-layers, last-layers  --num-layers-at-start/end-in-bf16
  partial-blocks             dims not multiples of the format's block: transformers
                             mis-reads such FP8 blocks and vLLM's fused layers refuse them
  odd-in-features            NVFP4 packs two codes a byte, so K must be even
  fused-sibling              see below
  name-collision             see below

Fused siblings: vLLM and SGLang load q/k/v as one layer and gate/up as one layer,
and all experts of an MoE layer as one FusedMoE with a single quantization method.
They refuse (or silently mis-load) a checkpoint where only some parts of such a
layer are quantized. So when any member of a group must stay BF16, the whole group
stays BF16. Groups: {q,k,v}_proj of one attention; {gate,up}_proj of one MLP; every
tensor of ``<layer>.mlp.experts.<i>.*`` for one layer.

Name collisions: loaders match ``modules_to_not_convert`` entries as prefixes at a dot
boundary and as suffixes (transformers' ``should_convert_module``). A kept name that
would also match a quantized module makes that loader skip it and read FP8 bytes as
BF16, so such a module is kept too.

NVFP4 scale groups: a fused layer in vLLM/SGLang's ModelOpt path uses one per-tensor
global scale (``weight_scale_2``) for all its shards, so siblings that are quantized
must share it (``Plan.scale_groups``; applied in quantize.py).
"""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from quantroll.checkpoint.bf16_rule import EMBEDDING, LM_HEAD, NORM, ROUTER, kept_by_name
from quantroll.errors import QuantrollError
from quantroll.formats import Format

QUANTIZE, KEEP, COPY = "quantize", "keep", "copy"

NOT_2D, SKIP_PATTERN, FIRST_LAYERS, LAST_LAYERS = "not-2d", "skip-pattern", "first-layers", "last-layers"
PARTIAL_BLOCKS, ODD_IN_FEATURES, FUSED_SIBLING, NAME_COLLISION = (
    "partial-blocks",
    "odd-in-features",
    "fused-sibling",
    "name-collision",
)
NOT_A_WEIGHT = "not-a-weight"

REASONS = {
    EMBEDDING: "embedding table",
    LM_HEAD: "output head",
    NORM: "normalization weight",
    ROUTER: "MoE router gate",
    NOT_2D: "not a 2-D linear weight",
    SKIP_PATTERN: "matched a --skip pattern",
    FIRST_LAYERS: "in the first N layers kept in BF16",
    LAST_LAYERS: "in the last N layers kept in BF16",
    PARTIAL_BLOCKS: "dims not multiples of the format's block (use --allow-partial-blocks to quantize)",
    ODD_IN_FEATURES: "odd in_features cannot be packed two codes a byte",
    FUSED_SIBLING: "kept because a sibling in the same fused layer is kept",
    NAME_COLLISION: "a kept module's name also matches it in loaders' skip lists",
    NOT_A_WEIGHT: "not a .weight tensor (bias/buffer), copied unchanged",
}

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_EXPERT = re.compile(r"^(.*\.experts)\.\d+\.[^.]+$")
_QKV = frozenset({"q_proj", "k_proj", "v_proj"})
_GATE_UP = frozenset({"gate_proj", "up_proj"})
_EXPERT_GATE_UP = frozenset({"gate_proj", "up_proj", "w1", "w3"})


@dataclass(frozen=True)
class PlanRules:
    """User choices that decide kept-vs-quantized (everything else follows from names).

    skip: shell-style patterns (``*`` matches across dots) tested against the module
        name, every dot-suffix of it, and the tensor name: ``lm_head``,
        ``mlp.down_proj``, ``model.layers.3.*``, ``*.experts.*``.
    """

    skip: tuple[str, ...] = ()
    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0
    allow_partial_blocks: bool = False

    def __post_init__(self):
        if self.num_layers_at_start_in_bf16 < 0 or self.num_layers_at_end_in_bf16 < 0:
            raise QuantrollError("--num-layers-at-start-in-bf16 and --num-layers-at-end-in-bf16 must be >= 0")
        object.__setattr__(self, "skip", tuple(self.skip))


@dataclass(frozen=True)
class Decision:
    """What happens to one tensor. ``reason`` is a key of REASONS (empty when quantized)."""

    name: str
    module: str
    action: str  # QUANTIZE | KEEP | COPY
    reason: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Plan:
    """The decision for every tensor, plus what loaders must be told."""

    format: str
    decisions: Mapping[str, Decision]
    scale_groups: tuple[tuple[str, ...], ...] = field(default=())
    fused_experts_kept: tuple[str, ...] = field(default=())

    def quantized(self) -> list[str]:
        """Names of the tensors to quantize (``X.weight``)."""
        return [d.name for d in self.decisions.values() if d.action == QUANTIZE]

    def kept(self) -> dict[str, Decision]:
        """Kept weights by module name."""
        return {d.module: d for d in self.decisions.values() if d.action == KEEP}

    def modules_to_not_convert(self) -> list[str]:
        """Every kept module, plus fused ``...mlp.experts`` parents kept whole (sorted)."""
        return sorted({*self.kept(), *self.fused_experts_kept})

    def scale_group_of(self, name: str) -> tuple[str, ...]:
        """The quantized tensors that share a global scale with ``name`` (itself alone if none)."""
        for group in self.scale_groups:
            if name in group:
                return group
        return (name,)


def layer_index(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def fused_group(module: str) -> str | None:
    """The key of the loader-fused layer ``module`` belongs to (None if it is alone)."""
    m = _EXPERT.match(module)
    if m:
        return m.group(1)
    parent, _, last = module.rpartition(".")
    if last in _QKV:
        return f"{parent}:qkv"
    if last in _GATE_UP:
        return f"{parent}:gate_up"
    return None


def scale_group(module: str) -> str | None:
    """The key of the tensors that share one NVFP4 global scale in a fused layer."""
    parent, _, last = module.rpartition(".")
    if last in _QKV:
        return f"{parent}:qkv"
    if last in _GATE_UP or (last in _EXPERT_GATE_UP and _EXPERT.match(module)):
        return f"{parent}:gate_up"
    return None


def _named_reason(module: str, ndim: int) -> str:
    return kept_by_name(module) or (NOT_2D if ndim != 2 else "")


def matches_skip(name: str, module: str, patterns: Sequence[str]) -> str | None:
    """The first pattern that matches the tensor (see PlanRules.skip), else None."""
    parts = module.split(".")
    candidates = [name] + [".".join(parts[i:]) for i in range(len(parts))]
    for pattern in patterns:
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            return pattern
    return None


def transformers_would_skip(patterns: Sequence[str]):
    """A predicate equal to ``not transformers.quantizers_utils.should_convert_module``.

    Written out (not imported) because transformers is not a dependency; the test
    suite checks it against transformers itself.
    """
    if not patterns:
        return lambda full_name: False
    regex = re.compile(r"(?:" + "|".join(patterns) + r")(?:(?<=\.)|(?=\.|$))")
    suffixes = tuple(patterns)
    return lambda full_name: bool(regex.match(full_name)) or full_name.endswith(suffixes)


def plan(
    shapes: Mapping[str, Sequence[int]],
    fmt: Format,
    rules: PlanRules = PlanRules(),
    num_layers: int | None = None,
) -> Plan:
    """Decide every tensor of a checkpoint (name -> shape) for format ``fmt``.

    ``num_layers`` is the model's decoder layer count (config ``num_hidden_layers``);
    if None it is inferred from the largest ``layers.<i>`` index.
    """
    if num_layers is None:
        indices = [i for i in map(layer_index, shapes) if i is not None]
        num_layers = max(indices) + 1 if indices else 0
    first = rules.num_layers_at_start_in_bf16
    last_start = num_layers - rules.num_layers_at_end_in_bf16
    if num_layers and (first or rules.num_layers_at_end_in_bf16) and first >= last_start:
        raise QuantrollError(
            f"--num-layers-at-start-in-bf16 {first} and --num-layers-at-end-in-bf16 {rules.num_layers_at_end_in_bf16} "
            f"keep all {num_layers} layers of the model in BF16, so nothing would be quantized: keep their sum "
            f"below {num_layers}")

    decisions: dict[str, Decision] = {}
    for name, shape in shapes.items():
        shape = tuple(shape)
        if not name.endswith(".weight"):
            decisions[name] = Decision(name, name.rpartition(".")[0], COPY, NOT_A_WEIGHT)
            continue
        module = name[: -len(".weight")]
        reason, detail = _named_reason(module, len(shape)), ""
        if not reason:
            pattern = matches_skip(name, module, rules.skip)
            layer = layer_index(module)
            if pattern is not None:
                reason, detail = SKIP_PATTERN, pattern
            elif layer is not None and layer < first:
                reason = FIRST_LAYERS
            elif layer is not None and layer >= last_start:
                reason = LAST_LAYERS
            elif not rules.allow_partial_blocks and not fmt.divides(shape):
                reason, detail = PARTIAL_BLOCKS, f"{shape} vs block {fmt.weight_block}"
            elif fmt.stored.elements_per_byte > 1 and shape[1] % fmt.stored.elements_per_byte:  # packed codes (NVFP4: two a byte) need an even K
                reason, detail = ODD_IN_FEATURES, f"{shape}"
        decisions[name] = Decision(name, module, KEEP if reason else QUANTIZE, reason, detail)

    while True:  # keeping one module can make another collide or lose a sibling
        n_kept = sum(d.action == KEEP for d in decisions.values())
        fused_kept = _keep_fused_siblings(decisions)
        _keep_name_collisions(decisions, fused_kept)
        if sum(d.action == KEEP for d in decisions.values()) == n_kept:
            break
    return Plan(fmt.name, decisions, _scale_groups(decisions), tuple(sorted(fused_kept)))


def refuse_skipping_everything(the_plan: Plan) -> None:
    """--skip patterns that leave no weight to quantize would make a checkpoint labelled
    with the format that holds none of it: refused, naming the patterns that matched. Called
    by the writer (convert_checkpoint), not by plan(): attribution asks plan() which modules
    a flag set keeps, every module included."""
    decisions, fmt_name = the_plan.decisions, the_plan.format
    if any(d.action == QUANTIZE for d in decisions.values()):
        return
    patterns = list(dict.fromkeys(d.detail for d in decisions.values() if d.reason == SKIP_PATTERN))
    if patterns:
        shown = " ".join(repr(p) for p in patterns)
        raise QuantrollError(f"--skip {shown} keeps every quantizable weight in BF16, so the {fmt_name} checkpoint "
                             "would quantize nothing; narrow the pattern (e.g. 'model.layers.3.*', '*.mlp.down_proj')")


def refuse_unmatched_skips(the_plan: Plan, patterns: Sequence[str]) -> None:
    """A --skip pattern that matches no tensor of the checkpoint is almost always a typo
    ('model.layer.3.*' for 'model.layers.3.*'): taken silently, the module the user meant
    to keep in BF16 is quantized. Refused, naming the pattern and a module name to copy."""
    decisions = [d for d in the_plan.decisions.values() if d.action != COPY]
    for pattern in patterns:
        if not any(matches_skip(d.name, d.module, [pattern]) for d in decisions):
            example = next((d.module for d in decisions if d.action == QUANTIZE), "")
            raise QuantrollError(f"--skip {pattern!r} matches no weight of this checkpoint, so it would keep nothing "
                                 f"in BF16; give a module name or pattern of it ('*' crosses dots; e.g. "
                                 f"'{example}', '*.{example.rpartition('.')[2]}')")


def _keep_fused_siblings(decisions: dict[str, Decision]) -> set[str]:
    """Keep whole fused groups that have a kept member; return kept ``.experts`` parents."""
    groups: dict[str, list[Decision]] = defaultdict(list)
    for d in decisions.values():
        if d.action != COPY and (key := fused_group(d.module)) is not None:
            groups[key].append(d)
    experts_kept = set()
    for key, members in groups.items():
        kept = [d for d in members if d.action == KEEP]
        if not kept:
            continue
        for d in members:
            if d.action == QUANTIZE:
                why = f"{kept[0].module} ({kept[0].reason})"
                decisions[d.name] = Decision(d.name, d.module, KEEP, FUSED_SIBLING, why)
        if ":" not in key:  # an experts group, named by its fused parent module
            experts_kept.add(key)
    return experts_kept


def _keep_name_collisions(decisions: dict[str, Decision], extra_kept: set[str]) -> None:
    kept = sorted({d.module for d in decisions.values() if d.action == KEEP} | extra_kept)
    skips = transformers_would_skip(kept)
    for d in [d for d in decisions.values() if d.action == QUANTIZE and skips(d.module)]:
        culprit = next(k for k in kept if transformers_would_skip([k])(d.module))
        decisions[d.name] = Decision(d.name, d.module, KEEP, NAME_COLLISION, culprit)


def _scale_groups(decisions: dict[str, Decision]) -> tuple[tuple[str, ...], ...]:
    groups: dict[str, list[str]] = defaultdict(list)
    for d in decisions.values():
        if d.action == QUANTIZE and (key := scale_group(d.module)) is not None:
            groups[key].append(d.name)
    return tuple(tuple(sorted(g)) for g in groups.values() if len(g) > 1)
