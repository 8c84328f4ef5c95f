"""One request's state inside the engine: its tokens, its KV blocks, where it stands.

A ``Sequence`` is plain Python (no tensors but the routes saved at a preemption), so the
block manager and the scheduler that move it around are pure policy and testable
without a model. Invariant while it holds blocks: the KV cache holds positions
``[0, num_computed)``; the token at ``length - 1`` is the newest one and, once a first
token was sampled, the one the next decode step feeds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


class Status(enum.Enum):
    WAITING = "waiting"   # queued, or preempted (its KV was dropped; it will be recomputed)
    RUNNING = "running"   # holds blocks; prefilling until num_computed reaches prefill_target
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    index: int  # position in the generate() call's prompt list (results come back in this order)
    prompt: list[int]
    max_new_tokens: int
    seed: int
    tokens: list[int] = field(default_factory=list)  # generated so far
    logprobs: list[float] = field(default_factory=list)
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # positions whose KV is in the cache
    num_shared: int = 0  # of those, positions whose blocks came from the prefix cache at admission
    preemptions: int = 0
    finish_reason: str | None = None  # "stop" or "length"
    saved_routes: torch.Tensor | None = None  # MoE: routes of [0, n) kept when preempted (the ones sampled with)

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.tokens)

    def token_at(self, position: int) -> int:
        p = len(self.prompt)
        return self.prompt[position] if position < p else self.tokens[position - p]

    @property
    def prefill_target(self) -> int:
        """Positions a prefill must cover before this sequence can decode: the whole prompt
        for a new sequence (its last position's logits give the first token); after a
        preemption every known token but the newest, which the next decode step feeds."""
        return self.length if not self.tokens else self.length - 1

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def samples_after_prefill(self) -> bool:
        """Whether the prefill that completes this sequence samples its first token."""
        return not self.tokens

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.tokens)

    def append(self, token: int, logprob: float, stop_ids: frozenset[int]) -> bool:
        """Add one sampled token; True when it ends the sequence (a stop id or the length cap)."""
        return self.extend([token], [logprob], stop_ids)

    def extend(self, tokens: list[int], logprobs: list[float], stop_ids: frozenset[int]) -> bool:
        """Sampled tokens in order: up to and including the first stop id, at most up to the
        length cap (later ones were computed past the sequence's end and are dropped). True
        when the sequence ended. In slices, not one call a token: a decode chunk of 512 rows x
        8 tokens would be 4,096 calls of host time the GPU waits for."""
        room = self.max_new_tokens - len(self.tokens)
        take = tokens[:room]
        end = next((i for i, t in enumerate(take) if t in stop_ids), None) if stop_ids else None
        if end is not None:
            take = take[:end + 1]
        self.tokens.extend(take)
        self.logprobs.extend(logprobs[:len(take)])
        if end is not None:
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason is not None
