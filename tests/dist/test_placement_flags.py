"""Miles' placement flags: what each combination places, and a one-line refusal naming
the flag for each one that cannot be placed (before Ray or any rank starts)."""

import pytest

from quantroll.cli import main
from quantroll.distributed.context import from_environ
from quantroll.distributed.ray_launch import RayPlacement
from quantroll.errors import QuantrollError


def test_engines_of_their_own_come_after_the_trainer_ranks():
    p = RayPlacement(actor_num_nodes=1, actor_num_gpus_per_node=2, rollout_num_gpus=3)
    assert (p.trainer_ranks, p.engine_ranks, p.world_size) == (2, 3, 5)
    colocated = RayPlacement(actor_num_gpus_per_node=2, colocate=True)
    assert (colocated.engine_ranks, colocated.world_size) == (0, 2)


@pytest.mark.parametrize("kw, message", [
    ({"actor_num_gpus_per_node": 2}, "--rollout-num-gpus is missing: without --colocate"),
    ({"rollout_num_gpus": 0}, "--rollout-num-gpus is 0: without --colocate the engines need GPUs of their own"),
    ({"actor_num_gpus_per_node": 2, "rollout_num_gpus": 3, "colocate": True}, "--rollout-num-gpus 3 with --colocate"),
    ({"actor_num_nodes": 0, "rollout_num_gpus": 1}, "--actor-num-nodes must be >= 1"),
])
def test_placements_that_cannot_be_built_are_refused_naming_the_flag(kw, message):
    with pytest.raises(QuantrollError, match=message.replace("-", r"\-")):
        RayPlacement(**kw)


def test_the_command_line_refuses_a_placement_before_starting_ray(capsys):
    assert main(["train", "--device", "cpu", "--rollout-num-gpus", "0", "--num-rollout", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--rollout-num-gpus is 0" in err and "--colocate" in err


@pytest.mark.parametrize("flags, message", [
    (["--colocate"], "--colocate given inside a torchrun rank"),
    (["--actor-num-gpus-per-node", "2"], "--actor-num-gpus-per-node given inside a torchrun rank"),
    (["--rollout-num-gpus", "0"], "--rollout-num-gpus must be >= 1"),
])
def test_inside_torchrun_only_the_engine_ranks_flag_applies(monkeypatch, capsys, flags, message):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert main(["train", "--device", "cpu", "--num-rollout", "1", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_world_without_a_trainer_rank_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(QuantrollError, match="leaves no trainer rank"):
        from_environ("cpu", engine_ranks=2)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(QuantrollError, match="start it with torchrun"):
        from_environ("cpu", engine_ranks=1)
    assert from_environ("cpu", engine_ranks=0) is None
