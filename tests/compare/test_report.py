"""write_report / terminal_tables: files written, PNGs valid, the HTML self-contained and
escaped, every group and the failed run's error in report.md, emulated marked everywhere."""

from __future__ import annotations

import base64
import html
import json
import re
from html.parser import HTMLParser

import pytest

from quantroll.compare import load_runs, summarize, terminal_tables, write_report
from quantroll.compare.cells import CHI2_NEGATIVE, SHORT
from tests.compare.synth import build_matrix, spec, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("gap_vs_step.png", "gap_vs_response_len.png", "reward_vs_step.png", "eval_vs_step.png", "time_breakdown.png")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = build_matrix(tmp_path_factory.mktemp("report"))
    summary = summarize(load_runs(out))
    return out, summary, write_report(out, summary)


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.tags = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.refs += [(tag, k, v) for k, v in attrs if k in ("src", "href", "data")]


def test_every_file_is_written_and_returned(report):
    out, summary, written = report
    expected = {"summary.json", "report.md", "report.html", *(f"plots/{p}" for p in PLOTS)}
    assert set(written) == expected
    for rel, path in written.items():
        assert path == out / rel and path.is_file() and path.stat().st_size > 0
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert not list(out.rglob("*.tmp"))


def test_pngs_are_valid(report):
    import matplotlib.image

    out, _, _ = report
    for name in PLOTS:
        data = (out / "plots" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and data[12:16] == b"IHDR"
        img = matplotlib.image.imread(out / "plots" / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_html_is_self_contained_and_escaped(report):
    out, summary, _ = report
    text = (out / "report.html").read_text()
    parser = _Refs()
    parser.feed(text)
    assert parser.refs and all(v.startswith("data:image/png;base64,") for _, _, v in parser.refs)
    assert "script" not in parser.tags and "link" not in parser.tags
    embedded = sorted(base64.b64decode(v.split(",", 1)[1]) for _, _, v in parser.refs)
    assert embedded == sorted((out / "plots" / p).read_bytes() for p in PLOTS)
    error = summary["failed"][0]["error"]
    assert "<script>" in error and html.escape(error) in text
    for g in summary["groups"]:
        assert html.escape(g["label"]) in text


def test_markdown_names_every_group_the_failure_and_the_plots(report):
    out, summary, _ = report
    md = (out / "report.md").read_text()
    assert not re.search(r"(?<!\\)<", md)  # every '<' is escaped so that no error message opens raw HTML
    md = md.replace("\\|", "|").replace("\\<", "<")  # what a Markdown viewer shows
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    for g in summary["groups"]:
        assert any(f"| {g['label']} | {g['correction']} |" in r for r in rows), g["id"]
    for f in summary["failed"]:
        assert f["run_id"] in md and f["error"] in md
    for r in summary["runs"]:
        assert r["run_id"] in md
    refs = re.findall(r"!\[[^\]]*\]\((plots/[^)]+)\)", md)
    assert sorted(refs) == sorted(f"plots/{p}" for p in PLOTS)
    for metric in summary["gap_metrics"]:  # the legend explains every gap metric, by the name its column shows
        assert f"- `{SHORT[metric]}`: " in md and f"(metrics.jsonl key {metric})" in md
        assert f"- `{metric}`" not in md
    for line in (summary["notes"]["warmup"], summary["notes"]["break_even"], summary["notes"]["significance"]):
        assert line in md
    for m in summary["recommendation"]["modes"] + summary["recommendation"]["verdicts"]:
        assert m["text"] in md


def test_emulated_is_marked_everywhere(report):
    out, summary, _ = report
    texts = [(out / "report.md").read_text(), (out / "report.html").read_text(), terminal_tables(summary)]
    for t in texts:
        for label in ("mode 3: MXFP8", "mode 4: NVFP4"):
            assert label in t
            assert not re.search(re.escape(label) + r"(?! \(emulated\))", t)
    verdict = next(v for v in summary["recommendation"]["verdicts"] if v["mode"] == "mode 3: MXFP8")
    assert "(emulated)" in verdict["text"] and "emulation" in verdict["text"]


def test_terminal_tables(report):
    _, summary, _ = report
    text = terminal_tables(summary)
    for title in ("Gap at step 0", "Time per step", "Recommendation", "Failed runs"):
        assert title in text
    for g in summary["groups"]:
        assert g["label"] in text
    for v in summary["recommendation"]["verdicts"]:
        assert v["text"] in text
    assert summary["failed"][0]["error"] in text


def test_only_failed_runs_still_report(tmp_path):
    write_run(tmp_path, spec("fp8-0", "fp8", False, "none", 0, status="failed", error="boom: OOM"), [])
    summary = summarize(load_runs(tmp_path))
    written = write_report(tmp_path, summary)
    assert set(written) == {"summary.json", "report.md", "report.html"}
    assert "boom: OOM" in (tmp_path / "report.md").read_text()
    assert "boom: OOM" in terminal_tables(summary)


def test_html_shows_no_literal_backtick_and_code_spans_become_code(report):
    out, _, _ = report
    text = (out / "report.html").read_text()
    assert "`" not in text
    from quantroll.compare.htmlpage import _text

    assert _text("from `quantroll inspect` on <each>") == "from <code>quantroll inspect</code> on &lt;each&gt;"
    assert _text("an odd ` one") == "an odd  one"


def test_the_reward_table_has_no_accuracy_column_and_states_k(report):
    from quantroll.compare.tables import reward_table

    _, summary, _ = report
    t = reward_table(summary)
    assert "accuracy" not in t.headers and "final reward" not in t.headers
    k = {g["reward"]["last_k"] for g in summary["groups"]}
    assert k == {1} and "reward, last 1 steps" in t.headers  # 6 steps per run: k = max(1, min(5, 6 // 4))


def test_negative_chi2_is_explained_only_where_it_appears(tmp_path):
    for seed, chi2 in enumerate((-2e-7, 1e-7)):
        steps = [{"step": i, "reward_mean": 0.5, "chi2_token": chi2, "chi2_seq": abs(chi2),
                  "train_rollout_logprob_abs_diff": 1e-7} for i in range(2)]
        write_run(tmp_path / "neg", spec(f"bf16-{seed}", "bf16", False, "none", seed, moe=False), steps)
        steps = [{**s, "chi2_token": abs(chi2)} for s in steps]
        write_run(tmp_path / "pos", spec(f"bf16-{seed}", "bf16", False, "none", seed, moe=False), steps)
    for name, negative in (("neg", True), ("pos", False)):
        summary = summarize(load_runs(tmp_path / name))
        write_report(tmp_path / name, summary)
        md = (tmp_path / name / "report.md").read_text()
        assert (md.count(CHI2_NEGATIVE.replace("|", "\\|")) == 2) is negative  # step 0 and mean tables
        assert (summary["groups"][0]["gap_mean"]["chi2_token"]["mean"] < 0) is negative
