"""``compare --groups``: the groups of a study named one by one, instead of the full matrix.

The matrix flags (--precisions x --corrections x --modes x --kv-cache-dtypes) multiply
out: every correction on every low precision, every KV dtype over all of it. A study at
16K tokens cannot afford that, and it wants groups the matrix cannot express (a
sequence-level TIS arm beside a token-level one; an FP8 KV cache on mode 1 only). So a
group is written as what it is:

    GROUP := BASE ["+" MODIFIER]... ["@" N]

    BASE      bf16 (the baseline) | fp8, mxfp8, nvfp4 (mode 1: that rollout, BF16 training)
              | fp8-m2, mxfp8-m3, nvfp4-m4 (unified: the trainer's forward quantized too)
    MODIFIER  kvfp8 (the engine's KV cache in FP8), one correction: tis, tis-seq, tis-geo
              (truncated importance sampling at token / sequence / geometric-mean level),
              mask, mask-seq, mask-geo (IcePop-style masking at those levels), r3 (MoE
              routing replay), or top (--true-on-policy-mode: bf16 or fp8-m2)
    @N        run the group with the first N of --seeds only (default: all of them)

e.g. the long-response study: ``bf16,fp8,fp8+tis,fp8+tis-seq,fp8+mask,fp8-m2,fp8+kvfp8``.
A correction's flags go to the groups that name it and to no other (plain bf16 takes
none). Each group becomes runs of ``matrix.RunSpec``; the correction name carries the
level (``tis-seq``), so groups at different levels stay apart in the report.
"""

from __future__ import annotations

from quantroll.compare.matrix import LEVELED, RunSpec, _parse_ints
from quantroll.errors import QuantrollError
from quantroll.formats import FORMAT_NAMES, unified_modes
from quantroll.model.invariant import TESTED_RECIPES

GROUP_CORRECTIONS = ("tis", "tis-seq", "tis-geo", "mask", "mask-seq", "mask-geo", "r3")
OTHER_MODIFIERS = ("kvfp8", "top")
EXAMPLE = "bf16,fp8,fp8+tis,fp8+tis-seq,fp8+mask,fp8-m2,fp8+kvfp8"


def bases() -> dict[str, tuple[str, bool]]:
    """Base name -> (precision, unified), from the registered formats."""
    out = {"bf16": ("bf16", False)}
    out.update({p: (p, False) for p in FORMAT_NAMES})
    out.update({f"{p}-m{m}": (p, True) for m, p in sorted(unified_modes().items())})
    return out


def _known() -> str:
    return (f"bases {', '.join(bases())}; modifiers +{', +'.join(OTHER_MODIFIERS + GROUP_CORRECTIONS)}; "
            f"then @N for the first N seeds (e.g. {EXAMPLE})")


def _refuse(item: str, why: str) -> QuantrollError:
    return QuantrollError(f"--groups {item!r}: {why}")


def parse_group(item: str, seeds: list[int], moe: bool) -> list[RunSpec]:
    """One group -> its runs (one per seed it takes); ``response_len`` is set by the caller."""
    text, _, count = item.partition("@")
    base, *mods = [t.strip() for t in text.split("+")]
    if base not in bases():
        raise _refuse(item, f"unknown base {base!r}; known: {_known()}")
    unknown = [m for m in mods if m not in OTHER_MODIFIERS + GROUP_CORRECTIONS]
    if unknown:
        raise _refuse(item, f"unknown modifier {unknown[0]!r}; known: {_known()}")
    if len(set(mods)) != len(mods):
        raise _refuse(item, "a modifier is repeated")
    precision, unified = bases()[base]
    kv = "fp8" if "kvfp8" in mods else "bf16"
    top = "top" in mods
    corrections = [m for m in mods if m in GROUP_CORRECTIONS]
    if len(corrections) > 1:
        raise _refuse(item, f"one correction per group, got {', '.join(corrections)}; write one group for each")
    correction = corrections[0] if corrections else "none"
    if correction != "none" and precision == "bf16" and kv == "bf16":
        raise _refuse(item, "bf16 with a BF16 KV cache is the baseline, on-policy up to kernel noise: a correction "
                      "applies to a low-precision rollout (e.g. fp8+tis, bf16+kvfp8+tis)")
    if correction == "r3" and not moe:
        raise _refuse(item, "r3 (routing replay) needs an MoE model")
    if top and (correction != "none" or kv != "bf16" or not (precision == "bf16" or (unified and precision in TESTED_RECIPES))):
        raise _refuse(item, "+top (--true-on-policy-mode) takes bf16 or "
                      + ", ".join(f"{p}-m{m}" for m, p in unified_modes().items() if p in TESTED_RECIPES)
                      + ", with no correction and a BF16 KV cache")
    n = len(seeds)
    if count:
        try:
            n = int(count)
        except ValueError:
            raise _refuse(item, f"@{count}: give the number of seeds, e.g. @1") from None
        if not 1 <= n <= len(seeds):
            raise _refuse(item, f"@{n}: between 1 and the {len(seeds)} seeds of --seeds")
    return [RunSpec(precision, unified, correction, s, 0, kv_cache_dtype=kv, true_on_policy=top) for s in seeds[:n]]


def build_groups_matrix(groups: str, seeds: str, response_len: int, moe: bool, sweep_lens: str | None = None,
                        bf16_exceptions: bool = False) -> list[RunSpec]:
    """The runs of ``--groups``: each named group with its seeds, in the order written;
    ``bf16_exceptions`` repeats each low-precision group on the exceptions checkpoint;
    sweep runs (correction none) repeat each distinct rollout of the groups at every length."""
    import dataclasses

    seed_list = _parse_ints(seeds, "--seeds")
    items = [x.strip() for x in groups.split(",") if x.strip()]
    if not items:
        raise QuantrollError(f"--groups is empty; name the groups, e.g. {EXAMPLE}")
    specs: list[RunSpec] = []
    for item in items:
        specs += [dataclasses.replace(s, response_len=response_len) for s in parse_group(item, seed_list, moe)]
    if bf16_exceptions:
        specs += [dataclasses.replace(s, bf16_exceptions=True) for s in list(specs) if s.precision != "bf16"]
    rollouts = dict.fromkeys((s.precision, s.unified, s.kv_cache_dtype) for s in specs if not s.true_on_policy)
    for length in (_parse_ints(sweep_lens, "--sweep-response-len") if sweep_lens else []):
        specs += [RunSpec(p, u, "none", s, length, sweep=True, kv_cache_dtype=kv)
                  for p, u, kv in rollouts for s in seed_list]
    return list(dict.fromkeys(specs))  # a group written twice runs once
