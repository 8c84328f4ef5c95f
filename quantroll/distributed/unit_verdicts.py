"""Each unit's verdict in the cross-process weight update, said once, heard by every rank.

Two audiences. The broadcast group (the source and every engine): the source says how its
quantization of the unit went (a status word, then its text when not OK), and the loading
ranks' verdicts on their buckets are agreed (``collectives.agree``). The trainer ranks
outside that group (engines on ranks of their own): they take part in every unit's unshard
and would otherwise wait in the next one for a source that has left, so the source relays
each unit's outcome to them over the trainer group, where it is rank 0.

A failure is raised on every rank: at the source its own error, elsewhere PeerFailed
naming the rank (or NonFiniteError, whose tensor name a caller may act on).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from quantroll.distributed.collectives import PeerFailed, agree, broadcast, broadcast_text
from quantroll.distributed.context import DistContext
from quantroll.errors import NonFiniteError, QuantrollError

OK, NON_FINITE, REFUSED, PEER = 0, 1, 2, 3  # PEER: the text already names the rank that failed


class UnitVerdicts:
    """``ctx``: the broadcast group (None on a trainer rank outside it); ``src``: the
    source's rank in it; ``trainers``: the trainer group when it is not the broadcast
    group; ``loads``: this rank's engine takes the update (False on a source whose engine
    is a description)."""

    def __init__(self, ctx: DistContext | None, src: int, trainers: DistContext | None, device: torch.device,
                 loads: bool):
        self.ctx, self.src, self.trainers, self.device, self.loads = ctx, src, trainers, device, loads
        self.is_src = ctx is not None and ctx.rank == src

    def _exchange(self, status: int, message: str, ctx: DistContext, src: int) -> None:
        """Send (the source) or receive (everyone else: ``status`` ignored) a status word
        over ``ctx``; a failure at the source raises on every other rank of it."""
        word = torch.tensor([status], dtype=torch.int64, device=self.device)
        broadcast(ctx, word, src)
        status = int(word.item())
        if status == OK:
            return
        text = broadcast_text(ctx, message, src)
        if ctx.rank == src:
            return  # the source raises its own error
        if status == NON_FINITE:
            name = text.partition("'")[2].partition("'")[0] or None
            raise NonFiniteError(f"rank {self.src}: {text}", tensor=name)
        raise PeerFailed(text if status == PEER else f"rank {self.src}: {text}")

    def relay(self, status: int = OK, message: str = "") -> None:
        """The source's word to the trainer ranks outside the broadcast group."""
        if self.is_src and self.trainers is not None:
            self._exchange(status, message, self.trainers, 0)  # trainer rank 0 is the source

    def hear_relay(self) -> None:
        """A trainer rank outside the broadcast group: the source's word on this unit."""
        if self.trainers is not None:
            self._exchange(OK, "", self.trainers, 0)

    def source_outcome(self, make: Callable[[], object]) -> object:
        """The source's ``make()`` (the unit's payload), said to every rank of the broadcast
        group and relayed: a NonFiniteError or any other failure there stops them all at
        this unit, with its text. The other ranks get None."""
        if not self.is_src:
            self._exchange(OK, "", self.ctx, self.src)
            return None
        status, message, failure, result = OK, "", None, None
        try:
            result = make()
        except NonFiniteError as err:
            status, message, failure = NON_FINITE, str(err), err
        except Exception as err:  # noqa: BLE001 - said to every rank, then raised here
            status, message, failure = REFUSED, f"{type(err).__name__}: {err}", err
        self._exchange(status, message, self.ctx, self.src)
        if failure is not None:
            self.relay(status, message)
            raise failure
        return result

    def agreed(self, fn: Callable[[], None]) -> None:
        """``fn`` on every rank of the broadcast group, its outcome agreed (collectives.agree)
        and relayed. A peer's failure (PeerFailed, or its NonFiniteError, which agree names
        with its rank) is said once: by the source when it loads nothing (the engine ranks'
        own lines may not reach the user), else by the rank that failed."""
        try:
            agree(self.ctx, fn)
        except QuantrollError as err:
            self.relay(PEER, str(err))
            if self.is_src and not self.loads:
                raise QuantrollError(str(err)) from None
            raise
        self.relay(OK)
