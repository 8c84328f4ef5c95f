"""Ranks as Ray actors, placed with Miles' flags: ``--actor-num-nodes``,
``--actor-num-gpus-per-node``, ``--rollout-num-gpus``, ``--colocate``.

Ray is an optional extra (``pip install -e '.[ray]'``); torchrun needs nothing beyond
torch. The driver (the ``quantroll train`` process) starts a local Ray cluster when none
is given (``ray.init()``; ``RAY_ADDRESS`` joins one), reserves one bundle per rank in a
placement group (one GPU each on CUDA, a CPU share on a CPU), hosts the rendezvous store
itself (so it outlives any rank: quantroll/distributed/liveness.py reads the heartbeats there),
and starts one actor per rank with the variables torchrun would set. Each actor then runs
exactly what a torchrun rank runs.

Placements (quantroll/distributed/groups.py):
- colocated (``--colocate``): every rank one trainer shard and one engine on its GPU, so
  ``--rollout-num-gpus`` equals the trainer's GPUs;
- engines on GPUs of their own (``--rollout-num-gpus R`` without ``--colocate``): the
  trainer's ``--actor-num-nodes x --actor-num-gpus-per-node`` ranks first, then R engine
  ranks (one engine each); the trainer's rank 0 sends the weight updates to every engine.

Failures: an actor that dies is named by the driver (rank, pid, Ray's reason), the other
actors are stopped, and the run exits 1; a one-line error of any rank is said once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from quantroll.distributed.context import STORE_ENV
from quantroll.errors import QuantrollError

T = TypeVar("T")


@dataclass(frozen=True)
class RayPlacement:
    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 1
    rollout_num_gpus: int | None = None
    colocate: bool = False

    @property
    def trainer_ranks(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    @property
    def engine_ranks(self) -> int:
        """Ranks that hold an engine only (0: colocated)."""
        return 0 if self.colocate else self.rollout_num_gpus

    @property
    def world_size(self) -> int:
        return self.trainer_ranks + self.engine_ranks

    def __post_init__(self):
        for flag, value in (("actor-num-nodes", self.actor_num_nodes),
                            ("actor-num-gpus-per-node", self.actor_num_gpus_per_node)):
            if value < 1:
                raise QuantrollError(f"--{flag} must be >= 1, got {value}")
        if self.colocate:
            if self.rollout_num_gpus is not None and self.rollout_num_gpus != self.trainer_ranks:
                raise QuantrollError(f"--rollout-num-gpus {self.rollout_num_gpus} with --colocate must equal the "
                                     f"trainer's {self.trainer_ranks} GPUs (--actor-num-nodes x "
                                     "--actor-num-gpus-per-node), or drop --colocate to give the engines GPUs of "
                                     "their own")
        elif self.rollout_num_gpus is None or self.rollout_num_gpus < 1:
            given = "is missing" if self.rollout_num_gpus is None else f"is {self.rollout_num_gpus}"
            raise QuantrollError(f"--rollout-num-gpus {given}: without --colocate the engines need GPUs of their own; "
                                 "give --rollout-num-gpus N (N >= 1, one engine each) or add --colocate (every "
                                 "trainer rank holds one engine)")

    def describe(self) -> str:
        if self.colocate:
            return "colocated trainer + engine"
        return f"{self.trainer_ranks} trainer rank(s), then {self.engine_ranks} engine rank(s)"


def import_ray():
    try:
        import ray
    except ImportError:
        raise QuantrollError("--actor-num-nodes/--actor-num-gpus-per-node/--rollout-num-gpus/--colocate place the "
                             "ranks with Ray, which is not installed: pip install -e '.[ray]' (or start the ranks "
                             "with torchrun --nproc-per-node N)") from None
    return ray


def launch(target: Callable[[], T], placement: RayPlacement, device: str, log=print,
           env: dict[str, str] | None = None) -> T:
    """Run ``target()`` on every rank (a Ray actor each); returns rank 0's result. The
    target learns the placement's split from its caller (quantroll train passes
    ``engine_ranks=placement.engine_ranks``)."""
    import torch

    from quantroll.distributed.placement import RankFailure

    ray = import_ray()
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cuda = torch.device(device).type == "cuda"
    world = placement.world_size
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=True, configure_logging=False)
    cpus = float(ray.cluster_resources().get("CPU", 1))
    bundle = {"GPU": 1, "CPU": 1} if cuda else {"CPU": min(1.0, cpus / world)}
    group = placement_group([bundle] * world, strategy="PACK")
    ray.get(group.ready(), timeout=600)
    host = ray.util.get_node_ip_address()
    store = torch.distributed.TCPStore(host, 0, world, is_master=True, wait_for_workers=False)

    @ray.remote
    class Rank:
        def pid(self) -> int:
            return os.getpid()

        def run(self, variables: dict[str, str], fn):
            os.environ.update(variables)
            return fn()

    actors = [Rank.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                           scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r)
                           ).remote() for r in range(world)]
    pids = ray.get([a.pid.remote() for a in actors])
    futures = {}
    for rank, actor in enumerate(actors):
        variables = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0" if cuda else str(rank),
                     "MASTER_ADDR": host, "MASTER_PORT": str(store.port), STORE_ENV: f"{host}:{store.port}",
                     **(env or {})}
        futures[actor.run.remote(variables, target)] = rank
    log(f"ray: {world} rank(s) as actors (pids {', '.join(map(str, pids))}), "
        f"{'one GPU' if cuda else 'a CPU share'} each, {placement.describe()}")
    pending, result = list(futures), None
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            rank = futures[done[0]]
            try:
                value = ray.get(done[0])
            except ray.exceptions.RayActorError as err:
                reason = " ".join(str(err).split())[:300]
                raise RankFailure(f"rank {rank} (Ray actor, pid {pids[rank]}) died: {reason}; the run is stopped: "
                                  "resume it with --load from the last save") from None
            except QuantrollError as err:
                if getattr(err, "quiet", False):
                    continue  # another rank says what happened
                raise _plain(err) from None
            if rank == 0:
                result = value
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        ray.util.remove_placement_group(group)
    return result


def _plain(err: QuantrollError) -> QuantrollError:
    """The rank's error without Ray's wrapper (its traceback text), keeping the exit status."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, QuantrollError) else err
