"""The same through Ray actors on the CPU (skipped where Ray is not installed): the
scenarios against one process, and a killed actor named, then resumed with --load."""

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.dist import compare, scenarios, worker
from tests.dist.launch import ROOT, env

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_ranks(engines, tmp_path_factory):
    from quantroll.dist.ray_launch import RayPlacement, launch

    out = tmp_path_factory.mktemp("ray")
    target = functools.partial(worker.main, str(out), str(engines["fp8"]), str(engines["nvfp4"]))
    try:
        launch(target, RayPlacement(actor_num_gpus_per_node=2, colocate=True), "cpu",
               env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    finally:
        ray.shutdown()
    return compare.load(out)


def test_ray_ranks_match_one_process(ray_ranks, engines):
    results, tensors = ray_ranks
    assert results["world"] == 2
    for name, *_ in scenarios.TRAIN_CASES:
        compare.check_training(results, tensors, name)
    compare.check_generation(results, engines["fp8"])
    compare.check_sync(results, tensors, "fp8", engines["fp8"], check=True)


def _train(tmp_path, *extra):
    return [sys.executable, "-m", "quantroll", "train", "--device", "cpu", "--actor-num-gpus-per-node", "2",
            "--colocate", "--num-rollout", "4", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--rollout-max-response-len", "4", "--save", str(tmp_path / "save"), "--save-interval", "1",
            "--metrics-file", str(tmp_path / "m.jsonl"), *extra]


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


def test_killed_ray_actor_is_named_and_load_resumes(tmp_path):
    log = tmp_path / "run.log"
    proc = subprocess.Popen(_train(tmp_path), cwd=ROOT, env=env(), stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while len(_lines(tmp_path / "m.jsonl")) < 2:
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.2)
        pid = int(re.search(r"ray: 2 rank\(s\) as actors \(pids \d+, (\d+)\)", log.read_text()).group(1))
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 1, text[-4000:]
    assert re.search(r"quantroll train: error: rank 1 (died \(no heartbeat\)|\(Ray actor, pid \d+\) died)", text), \
        text[-4000:]
    done = subprocess.run(_train(tmp_path, "--load", str(tmp_path / "save")), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    assert [json.loads(line)["step"] for line in _lines(tmp_path / "m.jsonl")] == list(range(4))
