"""An FSDP2 run (CPU, gloo, 2 ranks) saves each rank's shards, not gathered whole tensors:
one file per rank, each holding its half of every sharded tensor; the state resumes on
2 ranks with the same metrics as a run that never stopped (bit for bit), on 1 process
(the shards joined; its whole save resumes on 2 ranks again), and a damaged shard file
is named."""

import json
import shutil
import subprocess
import sys

import pytest
from safetensors import safe_open

from tests.dist.launch import ROOT, env, torchrun

pytestmark = pytest.mark.slow

COMMON = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4",
          "--seed", "3"]


def _train(tmp_path, name, steps, *extra):
    return ["-m", "quantroll", "train", "--num-rollout", str(steps), *COMMON, "--metrics-file",
            str(tmp_path / f"{name}.jsonl"), *extra]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _learning(line: dict) -> dict:
    """The metrics that do not measure time or memory, nor count this process's engine
    loads (weight_version: a resumed run's engine starts counting again)."""
    return {k: v for k, v in line.items() if not (k.endswith("_time") or k.endswith("tokens_per_s")
                                                    or "memory" in k or k.endswith("_gib") or k == "weight_version")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharded")
    save = tmp / "save"
    whole = torchrun(2, _train(tmp, "straight", 3))
    assert whole.returncode == 0, whole.stderr[-4000:]
    first = torchrun(2, _train(tmp, "resumed", 2, "--save", str(save), "--save-interval", "1"))
    assert first.returncode == 0, first.stderr[-4000:]
    version = save / json.loads((save / "LATEST").read_text())["state"]
    files = {p.name: p.stat().st_size for p in version.iterdir()}
    kept = tmp / "step1"  # the version the resume below replaces
    shutil.copytree(version, kept)
    resumed = torchrun(2, _train(tmp, "resumed", 3, "--save", str(save), "--save-interval", "1", "--load",
                                 str(save)))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return tmp, save, kept, files


def test_each_rank_writes_its_own_shards(runs):
    tmp, save, version, files = runs
    assert set(files) == {"state.json", "state-rank00000-of-00002.safetensors", "state-rank00001-of-00002.safetensors"}
    record = json.loads((version / "state.json").read_text())
    assert record["format_version"] == 2 and record["world_size"] == 2 and record["step"] == 1
    name = "model.model.layers.0.mlp.down_proj.weight"
    layout = record["layout"][name]
    assert layout["sharded"] is True
    rows = []
    for rank in range(2):
        with safe_open(str(version / f"state-rank{rank:05d}-of-00002.safetensors"), "pt") as f:
            rows.append(f.get_slice(name).get_shape()[0])
            assert f.get_slice("master.0").get_shape()[0] < record["layout"]["master.0"]["shape"][0]
    assert sum(rows) == layout["shape"][0] and rows[0] == (layout["shape"][0] + 1) // 2  # torch.chunk's cut


def test_resume_on_as_many_ranks_continues_bit_for_bit(runs):
    tmp = runs[0]
    straight, resumed = _lines(tmp / "straight.jsonl"), _lines(tmp / "resumed.jsonl")
    assert [r["step"] for r in resumed] == [0, 1, 2]
    assert [_learning(r) for r in resumed] == [_learning(r) for r in straight]


def test_resume_in_one_process_joins_the_shards(runs, tmp_path):
    src_tmp, save = runs[0], runs[1]
    copy = tmp_path / "save"
    shutil.copytree(save, copy)
    metrics = tmp_path / "one.jsonl"
    shutil.copy(src_tmp / "resumed.jsonl", metrics)
    done = subprocess.run([sys.executable, "-m", "quantroll", "train", "--num-rollout", "4", *COMMON, "--device",
                           "cpu", "--metrics-file", str(metrics), "--load", str(copy), "--save", str(copy),
                           "--save-interval", "1"], cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert [r["step"] for r in _lines(metrics)] == [0, 1, 2, 3]
    version = copy / json.loads((copy / "LATEST").read_text())["state"]
    assert (version / "state.safetensors").is_file()  # one process saves whole again
    again = torchrun(2, ["-m", "quantroll", "train", "--num-rollout", "5", *COMMON, "--metrics-file", str(metrics),
                         "--load", str(copy), "--save", str(copy), "--save-interval", "1"])  # whole -> 2 ranks
    assert again.returncode == 0, again.stderr[-4000:]
    assert [r["step"] for r in _lines(metrics)] == [0, 1, 2, 3, 4]


def test_a_damaged_shard_is_named(runs, tmp_path):
    copy = tmp_path / "save"
    shutil.copytree(runs[1], copy)
    version = copy / json.loads((copy / "LATEST").read_text())["state"]
    shard = version / "state-rank00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    done = subprocess.run([sys.executable, "-m", "quantroll", "train", "--num-rollout", "4", *COMMON, "--device",
                           "cpu", "--load", str(copy), "--save", str(copy), "--save-interval", "1"], cwd=ROOT,
                          env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "state-rank00001-of-00002.safetensors is damaged (its bytes changed since the save: checksum mismatch)" \
        in done.stderr, done.stderr[-2000:]
