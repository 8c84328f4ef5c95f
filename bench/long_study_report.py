"""docs/reports/long-responses/ from what the long-study jobs saved (bench/long_study.sh report).

Reads the jobs' folders under ``--root`` (each as a call left it, or unpacked from its
JOB.tgz): the calls' records (what ran where), the study model's recipe, the calibration
rows, the gap job's compares at each length (step 0 and step 1 read from each run's
metrics.jsonl) and entropy, and the learning compares' answers and groups. Writes
report.md, report.html (one file, plots embedded), summary.json, commands.txt, plots/,
each compare's own report under gap-LEN/ (copied) and learn-4k/, learn-16k/ (answered again
from their summary.json by the current rule, see rejudge), and per job an extract of
what it read (jobs/JOB.json, long_study_jobs.py): a job whose raw folder is gone is
reported from it. A job that has not run is named as missing, never filled in. The findings (per length: within the seed
spread or not, how the gap grows, which correction helps, the published pattern) are the
reader's to write from these tables, in findings.md beside the report (shown first when present):
beyond compare's own answers, this script judges nothing.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import sys
from pathlib import Path

from long_study_gap import GAP_KEYS, gap_growth, gap_plot, read_json
from long_study_jobs import EXTRACTS, JOBS, job_results, save_extract
from long_study_learn import judged, learn_result, study_figure
from quantroll.compare.htmlpage import CSS, img_html
from quantroll.compare.report import write_report

PUBLISHED = ("Published ranges: one FP8 GEMM's error ~7e-4 "
             "(LMSYS); NeMo-RL's token_mult_prob_error (a ppl-ratio-like metric) stays below 1.03-1.05 when healthy; "
             "chi2_seq grows with length at a fixed per-token gap; Jet-RL: FP8 rollout with BF16 training matched "
             "BF16 below ~4K, drifted at 8K and failed to converge at 16K on some models (not monotone in length; "
             "arXiv 2601.14243).")
FINDINGS = "findings.md"  # the reader's conclusions, beside the report; this script writes none


def _ms(x: dict | None, fmt: str = ".3g") -> str:
    if not x or x.get("mean") is None:
        return "n/a"
    std = x.get("std")
    return f"{x['mean']:{fmt}}" + (f" ± {std:{fmt}}" if std is not None and x.get("n", 1) > 1 else "")


def _num(x: float | None, fmt: str = ".3g") -> str:
    return "n/a" if x is None else f"{x:{fmt}}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(map(str, r)) + " |" for r in rows)]


def _copy_compare(src: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in ("report.md", "report.html", "summary.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
    if (src / "plots").is_dir():
        shutil.copytree(src / "plots", dest / "plots")


def rejudge(root: Path, out: Path, data: dict) -> None:
    """A finished learning job's compare report, answered again by the current rule from its saved
    summary (the raw folder's, else the copy an earlier report kept): written under out/JOB/, and
    the job's answer and extract updated to match."""
    job = data["job"]
    source = next((p for p in (root / job / "compare" / "summary.json", out / job / "summary.json") if p.is_file()),
                  None)
    if source is None:
        return
    compare = judged(read_json(source))
    write_report(out / job, compare)
    data["result"] = learn_result(compare)
    save_extract(out, data)


def build(root: Path, out: Path, model: Path | None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    results = {job: job_results(root, out, job) for job in JOBS}
    missing = [j for j in JOBS if results[j] is None]
    got = {job: data or {} for job, data in results.items()}  # a job not run reads as empty
    ran = [c for job in JOBS for c in got[job].get("calls", [])]
    sft = read_json(model / "quantroll_sft.json") if model else None
    calibrate = got["calibrate"].get("calibrate")
    gaps = got["gap"].get("rows", [])
    learning = {job: got[job] for job in ("learn-4k", "learn-16k")}
    for job, data in learning.items():
        if data.get("result") is not None:
            rejudge(root, out, data)
    summary = {"calls": ran, "model": str(model) if model else None,
               "model_text": got["sft"].get("model_text"),
               "sft": {k: sft.get(k) for k in ("task", "shape", "parameters", "steps_run", "stopped_by",
                                               "greedy_after", "checks")} if sft else None,
               "calibrate": calibrate, "gap": gaps,
               "learn": {job: data.get("result") for job, data in learning.items()}, "learn_progress": {}}
    md = ["# The long-response study (issue 42): FP8 rollout at 4K / 8K / 16K-token responses", "",
          "Made by `bash bench/long_study.sh report` from the jobs' saved results (docs/long-study.md); a job "
          f"whose raw results are not here is reported from the extract an earlier report kept ({EXTRACTS}/JOB.json).", ""]
    findings = out / FINDINGS
    if findings.is_file():  # written by hand from the tables below; kept when the report is made again
        md += ["## Findings", "", f"(from [{FINDINGS}]({FINDINGS}), written from the tables below)", "",
               *findings.read_text().strip().splitlines(), ""]
    if study_figure(gaps, learning, out / "plots" / "study.png"):
        md += ["The study in one figure (the step-0 sequence KL by length; each learning job's reward per step, "
               "the mean of a group's seeds with their range as a band):", "", "![the study](plots/study.png)", ""]
    md += ["## What ran where", ""]
    md += _table(["job", "date", "GPU", "commit", "status", "seconds"],
                 [[c["job"], c["date"], c["gpu"], c["commit"][:12], c["status"], c["seconds"]] for c in ran]) \
        if ran else ["No job has run yet."]
    md += ["", f"Jobs with no results here: {', '.join(missing)}." if missing else "Every job left results.", ""]
    md += ["## The study model", ""]
    if sft:
        md += [f"`{model}`: {sft.get('parameters', 0) / 1e6:.2f}M parameters, task {json.dumps(sft.get('task'))}, "
               f"{sft.get('steps_run')} steps (stopped by {sft.get('stopped_by')}); greedy accuracy after: "
               f"{(sft.get('greedy_after') or {}).get('accuracy')}.", ""]
    else:
        md += ["No study model was given (`--model`).", ""]
    if summary["model_text"]:
        md += ["```", summary["model_text"].rstrip(), "```", ""]
    md += ["## Calibration: the knob", ""]
    if calibrate:
        from long_study_sample import table

        md += [table(calibrate["rows"]).rstrip(), ""]
    else:
        md += ["The calibrate job has not run.", ""]
    md += ["## The gap at steps 0 and 1, by length", "", PUBLISHED, ""]
    md += ["entropy: the trainer's mean per-token entropy over the step-0 samples (nats, `entropy` of train's "
           "metrics), beside the gap it comes with.", ""]
    if gaps:
        md += _table(["trace-len", "group", "seed", "response len", "entropy",
                      *(f"{k} step {s}" for k in GAP_KEYS for s in (0, 1))],
                     [[r["length"], r["label"], r["seed"], f"{r['response_len_mean'] or 0:.0f}",
                       f"{r['entropy@0']:.3g}" if r["entropy@0"] is not None else "n/a",
                       *(f"{r[f'{k}@{s}']:.3g}" if r[f"{k}@{s}"] is not None else "n/a" for k in GAP_KEYS for s in (0, 1))]
                      for r in gaps])
        lengths, growth = gap_growth(gaps)
        md += ["", "How the step-0 gap grows with length (a cell of several seeds: their mean; sequence KL: the k3 KL summed over "
               "a sequence's tokens, averaged over sequences; chi2_seq signed: an estimate, below zero where the "
               "batch's weights average below 1):", ""]
        md += _table(["group", "level", *map(str, lengths), f"{lengths[-1]} / {lengths[0]}"],
                     [[g["label"], g["level"], *(_num(g["values"][n]) for n in lengths), _num(g["growth"], ".2f")]
                      for g in growth])
        summary["gap_growth"] = growth
        if gap_plot(gaps, out / "plots" / "gap_vs_length.png"):
            md += ["", "![step-0 gap vs length](plots/gap_vs_length.png)"]
        for where in (root / "gap").glob("*/compare"):  # the raw compares' own reports, where they are here
            _copy_compare(where, out / f"gap-{where.parent.name}")
        copied = [f"[{n}](gap-{n}/report.md)" for n in sorted({r["length"] for r in gaps})
                  if (out / f"gap-{n}" / "report.md").is_file()]
        if copied:
            md += ["", "Each length's compare report (the gap by response-length bucket, per run; rollout times): "
                   + ", ".join(copied) + "."]
    else:
        md += ["The gap job has not run."]
    for job, data in learning.items():
        md += ["", f"## Learning runs: {job}", ""]
        result = data.get("result")
        if result is None:
            md += [f"The {job} job has not finished its compare."]
            progress = data.get("progress")
            if progress:
                md += ["", "Its runs so far (each run's own metrics; a run not done may restart):", ""]
                md += _table(["run", "status", "steps", "reward step 0", "reward last step",
                              "held-out accuracy (trainer) first", "accuracy last", "held-out reward (trainer) first", "reward last"],
                             [[r["run_id"], r["status"], r["steps"], _num(r["reward_first"]), _num(r["reward_last"]),
                               *(_num(r[f"heldout_{what}_{end}"]) for what in ("accuracy", "reward")
                                 for end in ("first", "last"))] for r in progress])
                summary["learn_progress"][job] = progress
            continue
        md += [f"- {line}" for line in result["answer"]] + [""]
        md += _table(["group", "correction", "seeds", "reward step 0", "reward last k",
                      "held-out accuracy (trainer) first", "held-out accuracy (trainer) last", "gap over steps"],
                     [[g["label"], g["correction"], ",".join(map(str, g["seeds"])), _ms(g["reward_step0"]),
                       _ms(g["reward_last_k"]), _ms(g["eval_trainer_first"]), _ms(g["eval_trainer_last"]),
                       _ms(g["gap_mean"])] for g in result["groups"]])
        md += ["", f"The whole compare report: [{job}/report.md]({job}/report.md)."]
        if (out / job / "plots" / "reward_vs_step.png").is_file():
            md += ["", f"![reward vs step, {job}]({job}/plots/reward_vs_step.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "commands.txt").write_text("".join(f"# {c['job']} {c['date']} on {c['gpu']} at {c['commit']}\n"
                                              + "".join(f"{x}\n" for x in c["commands"]) for c in ran))
    (out / "report.html").write_text(_html(md, out))
    return summary


def _html(md: list[str], out: Path) -> str:
    """The markdown's lines as HTML: tables as tables, images embedded, the rest as paragraphs."""
    body, table = [], []
    for line in md + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                cells = [html.escape(c.strip()) for c in line.strip("|").split(" | ")]
                tag = "th" if not table else "td"
                table.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            continue
        if table:
            body.append("<div class='scroll'><table>" + "".join(table) + "</table></div>")
            table = []
        if line.startswith("!["):
            name, path = line[2:].split("](")
            body.append(img_html(name, out / path.rstrip(")")))
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.strip() and line.strip() != "```":
            body.append("<p>" + re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(line)) + "</p>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><style>{CSS}</style>"
            f"<title>long-response study</title></head><body>{''.join(body)}</body></html>\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, required=True, help="the jobs' folder (LONG_STUDY_DIR)")
    p.add_argument("--out", type=Path, required=True, help="where the report goes")
    p.add_argument("--model", type=Path, help="the study model (its quantroll_sft.json is reported)")
    args = p.parse_args(argv)
    if not args.root.is_dir():
        print(f"long_study_report: --root {args.root} is not a folder: run the jobs first", file=sys.stderr)
        return 2
    if args.model and not (args.model / "config.json").is_file():
        print(f"long_study_report: --model {args.model} is not a checkpoint directory", file=sys.stderr)
        return 2
    build(args.root, args.out, args.model)
    print(f"report: {args.out / 'report.md'}  {args.out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # long_study_sample, beside this file
    sys.exit(main())
