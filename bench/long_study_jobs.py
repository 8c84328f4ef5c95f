"""Each long-study job's results as the report uses them, kept beside the report.

A job's raw folder (``.long_study/JOB/``, or unpacked from its JOB.tgz) lives on the machine
that ran it and in ignored files here, so it can be lost; the report must not lose a finished
job with it. So every report writes, per job whose raw folder it has, a compact extract of
everything it reads from that job (``jobs/JOB.json`` beside the report, committed), and a job
without a raw folder is reported from its extract. The raw folder wins when both exist: it is
what a later call left.
"""

from __future__ import annotations

import json
from pathlib import Path

from long_study_gap import gap_rows, read_json, read_jsonl
from long_study_learn import learn, learn_bands, learn_curves, learn_progress

JOBS = ("sft", "calibrate", "gap", "learn-4k", "learn-16k")
EXTRACTS = "jobs"  # the extracts' folder, inside the report's


def extract(root: Path, job: str) -> dict:
    """What the report reads of ``job``, from its raw folder ``root / job``."""
    data: dict = {"job": job, "calls": read_jsonl(root / job / "calls.jsonl")}
    if job == "sft":
        model_text = root / job / "model.txt"
        data["model_text"] = model_text.read_text() if model_text.is_file() else None
    elif job == "calibrate":
        data["calibrate"] = read_json(root / job / "calibrate.json")
    elif job == "gap":
        data["rows"] = gap_rows(root)
    else:
        # the job's answer once its last call says done: run one at a time (learn-16k's default), each
        # run's own compare writes a summary of the runs so far, which must not read as the job's answer
        finished = bool(data["calls"]) and data["calls"][-1].get("status") == "done"
        curves = learn_curves(root, job)
        data.update(result=learn(root, job) if finished else None, bands=learn_bands(curves),
                    progress=learn_progress(curves))
    return data


def job_results(root: Path, report: Path, job: str) -> dict | None:
    """``job``'s results: extracted from its raw folder (and saved as ``report/jobs/JOB.json``)
    where a call of the job left one (its calls.jsonl), else the extract an earlier report
    saved, else None (not run). A folder without calls (a call that broke before its record)
    does not replace a saved extract."""
    if (root / job / "calls.jsonl").is_file():
        return save_extract(report, extract(root, job))
    return read_json(report / EXTRACTS / f"{job}.json")


def save_extract(report: Path, data: dict) -> dict:
    """Keep ``data`` (a job's extract) as ``report/jobs/JOB.json``; returns it."""
    saved = report / EXTRACTS / f"{data['job']}.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(data, indent=1) + "\n")
    return data
