"""Which rows of a batch this rank trains on, and the gathers that give every rank the
whole batch's numbers (quantroll/rl/step.py's ``rows`` argument).

Each rank takes a contiguous, equal share of every minibatch, so every rank runs the
same number of forward and backward passes (FSDP2's collectives pair them up); the loss
of a share is normalized by the whole minibatch's token count, so the gradients FSDP2
sums over ranks are the minibatch's gradient.
"""

from __future__ import annotations

import torch

from quantroll.distributed.collectives import all_gather_rows, all_gather_varlen, all_sum, all_true
from quantroll.distributed.context import DistContext
from quantroll.distributed.data_parallel import share
from quantroll.errors import QuantrollError


def check_divisible(samples: int, global_batch: int | None, world: int) -> None:
    """Equal shares or a one-line refusal naming the flags."""
    if samples % world:
        raise QuantrollError(f"--rollout-batch-size x --n-samples-per-prompt = {samples} samples do not split evenly "
                             f"over {world} ranks; make it a multiple of {world}")
    if global_batch is not None and global_batch % world:
        raise QuantrollError(f"--global-batch-size {global_batch} does not split evenly over {world} ranks; make it "
                             f"a multiple of {world}")


class RankRows:
    lockstep = True

    def __init__(self, ctx: DistContext):
        self.ctx = ctx

    def mine(self, rows: list[int]) -> list[int]:
        start, stop = share(len(rows), self.ctx.rank, self.ctx.world_size)
        return rows[start:stop]

    def gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        return all_gather_rows(self.ctx, t)

    def gather_routes(self, routes: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per-sequence [len_i, layers, k] tables of every rank, in row order."""
        tail = tuple(routes[0].shape[1:]) if routes else None
        lengths = torch.tensor([r.shape[0] for r in routes], dtype=torch.int64)
        flat = torch.cat([r.reshape(-1) for r in routes]) if routes else torch.zeros(0, dtype=torch.int64)
        all_lengths = all_gather_varlen(self.ctx, lengths)
        all_flat = all_gather_varlen(self.ctx, flat.to(torch.int64))
        dims = all_gather_varlen(self.ctx, torch.tensor(tail or (), dtype=torch.int64))
        out = []
        for lens, data, dim in zip(all_lengths, all_flat, dims):
            shape = tuple(dim.tolist())
            offset = 0
            for n in lens.tolist():
                size = n * int(torch.tensor(shape).prod()) if shape else 0
                out.append(data[offset: offset + size].view(n, *shape).to(routes[0].dtype if routes else torch.int64))
                offset += size
        return out

    def sum(self, values: list[float]) -> list[float]:
        return all_sum(self.ctx, values)

    def all_true(self, flag: bool) -> bool:
        return all_true(self.ctx, flag)

    def share(self, tokens: torch.Tensor) -> float:
        total, count = all_sum(self.ctx, [float(tokens.sum()), float(tokens.numel())])
        return total / count if count else 0.0
