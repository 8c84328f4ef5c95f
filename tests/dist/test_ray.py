"""The same through Ray actors on the CPU (skipped where Ray is not installed): the
scenarios against one process, colocated and with the engine on an actor of its own
(2 trainer actors + 1 engine actor), and a killed actor named, then resumed with --load
(a colocated rank, and the engine actor)."""

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


# placement -> (RayPlacement arguments, worker's engine ranks, training cases run)
PLACEMENTS = {"colocated": ({"actor_num_gpus_per_node": 2, "colocate": True}, 0, ""),
              "engine-actor": ({"actor_num_gpus_per_node": 2, "rollout_num_gpus": 1}, 1, "dense,moe-replay")}


@pytest.fixture(scope="module", params=list(PLACEMENTS))
def ray_ranks(request, engines, tmp_path_factory):
    from quantroll.distributed.ray_launch import RayPlacement, launch

    flags, engine_ranks, cases = PLACEMENTS[request.param]
    out = tmp_path_factory.mktemp("ray")
    target = functools.partial(worker.main, str(out), str(engines["fp8"]), str(engines["nvfp4"]), cases,
                               str(engine_ranks))
    placement = RayPlacement(**flags)
    try:
        launch(target, placement, "cpu", env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    finally:
        ray.shutdown()
    results, tensors = compare.load(out)
    assert results["world"] == placement.world_size and results["engine_ranks"] == engine_ranks
    return results, tensors, cases


def test_ray_ranks_match_one_process(ray_ranks, engines):
    results, tensors, cases = ray_ranks
    for name in cases.split(",") if cases else [c[0] for c in scenarios.TRAIN_CASES]:
        compare.check_training(results, tensors, name)
    compare.check_generation(results, engines["fp8"])
    compare.check_sync(results, tensors, "fp8", engines["fp8"], check=True)


def _train(tmp_path, *extra):
    return [sys.executable, "-m", "quantroll", "train", "--device", "cpu", "--actor-num-gpus-per-node", "2",
            "--num-rollout", "4", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--rollout-max-response-len", "4", "--save", str(tmp_path / "save"), "--save-interval", "1",
            "--metrics-file", str(tmp_path / "m.jsonl"), *extra]


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


# placement flags -> the rank killed (the last actor: a colocated rank, or the engine actor)
KILLS = {"colocated": (["--colocate"], 1), "engine-actor": (["--rollout-num-gpus", "1"], 2)}


@pytest.mark.parametrize("case", list(KILLS))
def test_killed_ray_actor_is_named_and_load_resumes(tmp_path, case):
    flags, victim = KILLS[case]
    log = tmp_path / "run.log"
    proc = subprocess.Popen(_train(tmp_path, *flags), cwd=ROOT, env=env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while len(_lines(tmp_path / "m.jsonl")) < 2:
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.2)
        pids = re.search(r"ray: \d+ rank\(s\) as actors \(pids ([\d, ]+)\)", log.read_text()).group(1).split(", ")
        assert len(pids) == victim + 1
        os.kill(int(pids[victim]), signal.SIGKILL)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 1, text[-4000:]
    assert re.search(rf"quantroll train: error: rank {victim} (died \(no heartbeat\)|\(Ray actor, pid \d+\) died)",
                     text), text[-4000:]
    done = subprocess.run(_train(tmp_path, "--load", str(tmp_path / "save"), *flags), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    assert [json.loads(line)["step"] for line in _lines(tmp_path / "m.jsonl")] == list(range(4))
