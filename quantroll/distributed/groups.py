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
    results    every rank         the rollout's results, from the first engine rank to every
                                  trainer rank
    world      every rank         the checks agreed before a run, liveness

The broadcast and results groups wait a whole phase for a peer (context.PHASE_TIMEOUT):
an engine rank waits there for the next request while the trainer steps, a trainer rank
for the results while the engines roll out, and either may take longer than the
ordinary collective timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantroll.distributed.context import PHASE_TIMEOUT, DistContext


@dataclass(frozen=True)
class RankGroups:
    world: DistContext
    trainers: DistContext | None  # None on an engine rank
    engines: DistContext | None  # None on a trainer rank that holds no engine
    broadcast: DistContext | None  # None on a trainer rank other than 0 when the engines are ranks of their own
    results: DistContext  # every rank (the world's members with the phase-long timeout)

    @classmethod
    def of(cls, ctx: DistContext) -> RankGroups:
        """The groups of ``ctx``'s world. Collective when the engines are ranks of their own
        (every rank creates every group, in the same order)."""
        if not ctx.engine_ranks:
            return cls(ctx, ctx, ctx, ctx, ctx)
        first = ctx.world_size - ctx.engine_ranks
        trainers = ctx.subgroup(range(first))
        engines = ctx.subgroup(range(first, ctx.world_size))
        broadcast = ctx.subgroup([0, *range(first, ctx.world_size)], timeout=PHASE_TIMEOUT)
        results = ctx.subgroup(range(ctx.world_size), timeout=PHASE_TIMEOUT)
        return cls(ctx, trainers, engines, broadcast, results)

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
