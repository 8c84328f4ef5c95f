"""The process groups of a run, by role: which ranks train, which hold engines, and which
take part in the weight broadcast.

Colocated (``--colocate``, the default under torchrun): every rank holds one trainer
shard and one whole engine, so every group is the world. With engines on ranks of their
own (``--rollout-num-gpus R`` without ``--colocate``, as Miles places them), the world's
first T ranks train and its last R ranks hold one engine each:

    trainers   ranks 0..T-1       FSDP2 shards, the optimizer, the rows of a batch, saves
    engines    ranks T..T+R-1     data-parallel rollout (each engine a share of the prompts)
    broadcast  rank 0, T..T+R-1   the control messages and the weight update: trainer rank 0
                                  quantizes and sends, every engine rank loads
    world      every rank         the checks agreed before a run, the rollout's results
                                  (from the first engine rank to every trainer rank), liveness
"""

from __future__ import annotations

from dataclasses import dataclass

from quantroll.dist.context import DistContext


@dataclass(frozen=True)
class RankGroups:
    world: DistContext
    trainers: DistContext | None  # None on an engine rank
    engines: DistContext | None  # None on a trainer rank that holds no engine
    broadcast: DistContext | None  # None on a trainer rank other than 0 when the engines are ranks of their own

    @classmethod
    def of(cls, ctx: DistContext) -> RankGroups:
        """The groups of ``ctx``'s world. Collective when the engines are ranks of their own
        (every rank creates every group, in the same order)."""
        if not ctx.engine_ranks:
            return cls(ctx, ctx, ctx, ctx)
        first = ctx.world_size - ctx.engine_ranks
        trainers = ctx.subgroup(range(first))
        engines = ctx.subgroup(range(first, ctx.world_size))
        broadcast = ctx.subgroup([0, *range(first, ctx.world_size)])
        return cls(ctx, trainers, engines, broadcast)

    @property
    def colocated(self) -> bool:
        return not self.world.engine_ranks

    @property
    def is_engine_rank(self) -> bool:
        """This rank holds an engine and no trainer shard."""
        return self.trainers is None

    @property
    def first_engine(self) -> int:
        """The world rank that sends the rollout's results to the trainer ranks."""
        return self.world.world_size - self.world.engine_ranks

    @property
    def role(self) -> str:
        if self.colocated:
            return "trainer + engine"
        return "engine" if self.is_engine_rank else "trainer"
