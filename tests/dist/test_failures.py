"""A rank killed in the middle of a torchrun training (CPU, gloo) stops the run with a line
naming it, and ``--load`` resumes from the last save: in the end the metrics file holds
every step exactly once, in order. Colocated (2 ranks), and with the engine on a rank of
its own (2 trainer ranks + 1 engine rank, --rollout-num-gpus 1): the engine rank killed,
and a trainer rank killed."""

import json
import os
import re
import signal
import time

import pytest

from tests.dist.launch import popen, torchrun

pytestmark = pytest.mark.slow

STEPS = 5


def _train_args(tmp_path, *extra):
    return ["-m", "quantroll", "train", "--num-rollout", str(STEPS), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4", "--save", str(tmp_path / "save"),
            "--save-interval", "1", "--metrics-file", str(tmp_path / "m.jsonl"), *extra]


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


# (processes, extra flags, the rank killed)
CASES = {"colocated": (2, [], 1), "engine-rank": (3, ["--rollout-num-gpus", "1"], 2),
         "trainer-rank": (3, ["--rollout-num-gpus", "1"], 1)}


@pytest.mark.parametrize("case", list(CASES))
def test_killed_rank_is_named_and_load_resumes_without_lost_or_repeated_steps(tmp_path, case):
    nproc, extra, victim = CASES[case]
    log = tmp_path / "run.log"
    proc = popen(nproc, _train_args(tmp_path, *extra), log)
    try:
        deadline = time.monotonic() + 300
        while len(_lines(tmp_path / "m.jsonl")) < 2:  # two steps done (and saved)
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.2)
        pid = int(re.search(rf"quantroll: rank {victim} of {nproc} \(pid (\d+)\)", log.read_text()).group(1))
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode != 0
    assert re.search(rf"quantroll train: error: rank {victim} died \(no heartbeat\), seen by rank \d during", text), \
        text[-4000:]
    done = torchrun(nproc, _train_args(tmp_path, "--load", str(tmp_path / "save"), *extra))
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in _lines(tmp_path / "m.jsonl")]
    assert [r["step"] for r in records] == list(range(STEPS))
    # the KV capacity of the pool the rollout ran in (an engine rank's), not the writing rank's estimate
    assert all(r["kv_cache_capacity_tokens"] > 0 and r["engine_weight_gib"] > 0 for r in records)
