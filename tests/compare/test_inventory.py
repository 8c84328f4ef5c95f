"""What each checkpoint of a study kept in high precision: inspect's own data, in the report."""

import json

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.checkpoint.stats import inspect_checkpoint, kept_by_reason
from quantroll.compare import load_runs, summarize, write_report
from quantroll.compare.inventory import INVENTORY_FILE, load_inventory, write_inventory
from tests.compare.synth import write_constant_runs


def test_inventory_is_inspects_report_and_the_report_lists_it(tmp_path, tiny_checkpoint):
    src = tiny_checkpoint()  # k/v projections of 192 rows: partial blocks, so q/k/v stay BF16 as fused siblings
    fp8 = tmp_path / "fp8"
    convert_checkpoint(src, fp8, ConvertConfig(format="fp8", progress=False))
    out = tmp_path / "study"
    write_inventory(out, {"bf16": src, "fp8": fp8})
    rows = {r["precision"]: r for r in json.loads((out / INVENTORY_FILE).read_text())}
    assert rows["bf16"]["format"] == "bf16" and rows["bf16"]["quantized"] == 0
    report = inspect_checkpoint(fp8)
    assert rows["fp8"]["quantized"] == len(report.quantized)
    assert {k["reason"]: k["names"] for k in rows["fp8"]["kept"]} == \
        {reason: sorted(names) for reason, names in kept_by_reason(report.kept).items()}
    assert {"partial-blocks", "fused-sibling"} <= {k["reason"] for k in rows["fp8"]["kept"]}
    assert all(k["count"] == len(k["names"]) and k["rule"] for k in rows["fp8"]["kept"])

    write_constant_runs(out, {"bf16": [(0.001, 0.5)], "none": [(0.3, 0.5)]})
    summary = summarize(load_runs(out), load_inventory(out))
    write_report(out, summary)
    md = (out / "report.md").read_text()
    assert "## Checkpoints: what stayed in high precision, and why" in md
    partial = next(k for k in rows["fp8"]["kept"] if k["reason"] == "partial-blocks")
    assert f"{partial['count']} partial-blocks: {partial['names'][0]}" in md and partial["rule"] in md


def test_a_missing_inventory_is_an_empty_list(tmp_path):
    assert load_inventory(tmp_path) == []
