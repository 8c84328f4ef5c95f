"""compare's --bf16-exceptions group: the flags a user pasted, or `quantroll attribute`'s
measurement of them (auto), turned into the convert fields of the low-precision checkpoints the
group's runs load. Kept apart from the command so that compare reaches attribution in one place."""

from __future__ import annotations

import shlex

from quantroll.errors import QuantrollError


def parse_exceptions(value: str | None):
    """None (no group), "auto", or the FlagSet a user pasted (checked now, before any work)."""
    if value is None:
        return None
    if value.strip() == "auto":
        return "auto"
    from quantroll.attribution.flagset import parse

    flags = parse(value, "--bf16-exceptions")
    if flags.empty:
        raise QuantrollError("--bf16-exceptions is empty; give auto or the flags `quantroll attribute` printed")
    return flags


def low_precisions(specs) -> list[str]:
    return sorted({s.precision for s in specs if s.bf16_exceptions})


def auto_exceptions(setup, specs, args) -> dict:
    """precision -> convert fields of the BF16 exceptions `quantroll attribute` measures on the
    source (its report under OUT/attribution/<precision>/; reused when its configuration and
    source are unchanged). The study's own runs are the verification, so attribute's is off."""
    import dataclasses
    import json

    from quantroll.attribution.flagset import parse
    from quantroll.attribution.report import write_outputs
    from quantroll.attribution.run import AttributeConfig, run_attribution

    out = {}
    for precision in low_precisions(specs):
        cfg = AttributeConfig(hf_checkpoint=args.hf_checkpoint, builtin_model=args.builtin_model, precision=precision,
                              verify_seeds=(), device=args.device, compute_dtype=args.compute_dtype)
        where = setup.out_dir / "attribution" / precision
        done = where / "attribution.json"
        previous = json.loads(done.read_text()) if done.is_file() else None
        if previous and previous.get("config") == json.loads(json.dumps(dataclasses.asdict(cfg))) \
                and previous.get("source") == str(setup.source) and "proposal" in previous:
            result = previous
            print(f"bf16 exceptions for {precision}: measured earlier ({done})")
        else:
            result = run_attribution(cfg)
            where.mkdir(parents=True, exist_ok=True)
            write_outputs(result, where)
        p = result["proposal"]
        if p.get("unreachable"):  # as before the measurements were kept: no flag set to run with
            raise QuantrollError(f"--bf16-exceptions auto for {precision}: {p['unreachable']} "
                                 f"({where / 'report.md'})")
        print(f"bf16 exceptions for {precision}: {p['flags_text'] or '(none needed)'} (gap {p['gap']['mean']:.3g} "
              f"vs {result['gap_full']['mean']:.3g} with every linear {precision}; {where / 'report.md'})")
        out[precision] = parse(shlex.join(p["flags"])).convert_fields()
    return out
