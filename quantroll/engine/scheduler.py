"""What the engine runs next: a prefill pass or a few decode steps, and for which sequences.

Pure policy over ``Sequence`` objects and the ``BlockManager``; no tensors. Continuous
batching: waiting sequences are admitted whenever blocks and the prefill token budget
allow, even while others decode, and a finished sequence's blocks go back at once. Long
prompts prefill in chunks of at most ``max_num_batched_tokens``. When the pool runs dry
mid-decode the newest sequence is preempted: its blocks are dropped, it goes back to the
front of the queue keeping its tokens, and is recomputed later. Nothing fails or is
truncated for lack of blocks, as long as one sequence alone fits (checked up front).

``policy="static"`` reproduces the engine this one replaced, for benchmarks: admit as
many sequences as fit with their maximum length reserved, run them until the longest
ends (finished rows are still computed), then the next group.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from quantroll.engine.block_manager import BlockManager, blocks_for
from quantroll.engine.sequence import Sequence, Status
from quantroll.errors import QuantrollError

POLICIES = ("continuous", "static")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 512  # sequences decoding at once (the largest CUDA-graph bucket)
    max_num_batched_tokens: int = 8192  # tokens of one prefill pass; longer prompts prefill in chunks
    decode_steps: int | None = None  # decode steps between two looks of the host; None: 8 on a GPU, 1 on a CPU
    policy: str = "continuous"

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "decode_steps"):
            value = getattr(self, name)
            if value is None and name == "decode_steps":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise QuantrollError(f"{name} must be an integer >= 1, got {value!r}")
        if self.policy not in POLICIES:
            raise QuantrollError(f"scheduler policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")


@dataclass(frozen=True)
class PrefillChunk:
    seq: Sequence
    start: int  # first position computed in this pass
    count: int  # positions computed

    @property
    def completes(self) -> bool:
        return self.start + self.count == self.seq.prefill_target


@dataclass(frozen=True)
class Prefill:
    chunks: tuple[PrefillChunk, ...]


@dataclass(frozen=True)
class Decode:
    seqs: tuple[Sequence, ...]
    steps: int


class Scheduler:
    def __init__(self, blocks: BlockManager, cfg: SchedulerConfig, max_new_tokens: int):
        if cfg.decode_steps is None:
            raise ValueError("the engine resolves decode_steps before scheduling")
        self.blocks, self.cfg = blocks, cfg
        self.max_new_tokens = max_new_tokens  # the static policy reserves this for every sequence
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.held: list[Sequence] = []  # static policy: finished, still computed until the group ends
        self.on_preempt = None  # called with a sequence just before its blocks are dropped
        self.preemptions = 0
        self.prefill_tokens = 0
        self.prefill_tokens_saved = 0

    def add(self, seq: Sequence) -> None:
        need = blocks_for(self._reserve(seq), self.blocks.block_size)
        if need > self.blocks.usable_blocks:
            raise QuantrollError(
                f"prompt {seq.index} needs {need} KV blocks of {self.blocks.block_size} tokens "
                f"({len(seq.prompt)} prompt + {seq.max_new_tokens} new), more than the whole KV cache holds "
                f"({self.blocks.usable_blocks} blocks); raise the KV-cache budget (--kv-cache-memory-gb) or lower "
                "max_new_tokens")
        self.waiting.append(seq)

    def _reserve(self, seq: Sequence) -> int:
        """Positions a sequence may come to hold: its prompt and every token it may generate
        (the last one sampled is never fed, hence - 1); static: the maximum for everyone."""
        new = self.max_new_tokens if self.cfg.policy == "static" else seq.max_new_tokens
        return len(seq.prompt) + new - 1

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> Prefill | Decode | None:
        chunks = self._prefill_chunks()
        if chunks:
            for c in chunks:
                self.prefill_tokens += c.count
            return Prefill(tuple(chunks))
        return self._decode()

    # -- prefill --------------------------------------------------------------------
    def _prefill_chunks(self) -> list[PrefillChunk]:
        budget = self.cfg.max_num_batched_tokens
        chunks = []
        for seq in self.running:  # chunked prefills in flight go first
            if seq.prefilling and budget > 0:
                n = min(seq.prefill_target - seq.num_computed, budget)
                chunks.append(PrefillChunk(seq, seq.num_computed, n))
                budget -= n
        if self.cfg.policy == "static" and (self.running or self.held):
            return chunks
        per_seq = blocks_for(self.cfg.decode_steps, self.blocks.block_size)  # what one chunk of decode may take
        for seq in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.cfg.max_num_seqs:
                break
            plan = self.blocks.prefix_plan(seq)
            if plan.pending:
                continue  # its prefix is being written by a sequence in flight: share it next time
            extra = self._reserve(seq) - seq.prefill_target if self.cfg.policy == "static" else 0
            headroom = 0 if self.cfg.policy == "static" else (len(self.running) + 1) * per_seq
            if self.blocks.blocks_to_admit(seq, plan, extra) + headroom > self.blocks.num_free:
                if self.running or chunks:
                    break  # leave the running sequences room to decode rather than preempt them at once
            if not self.blocks.admit(seq, plan, extra):
                break
            self.waiting.remove(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            self.prefill_tokens_saved += seq.num_shared
            n = min(seq.prefill_target - seq.num_computed, budget)
            chunks.append(PrefillChunk(seq, seq.num_computed, n))
            budget -= n
        return chunks

    def prefilled(self, chunks: tuple[PrefillChunk, ...]) -> None:
        for c in chunks:
            c.seq.num_computed = c.start + c.count
            self.blocks.mark_computed(c.seq, since=c.start)

    # -- decode ---------------------------------------------------------------------
    def _decode(self) -> Decode | None:
        steps = self.cfg.decode_steps
        for seq in list(self.running):  # oldest first: the newest give way
            if seq.status is not Status.RUNNING or seq.prefilling:
                continue
            need = seq.num_computed + min(steps, seq.remaining)
            while not self.blocks.grow(seq, need):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
        decoding = [s for s in self.running if not s.prefilling]
        batch = decoding + self.held
        if not batch:
            return None
        # no more steps than the longest remaining budget: a chunk past every sequence's cap
        # computes only rows that are thrown away (16 steps for 11 tokens at 8 per chunk)
        longest = max((s.remaining for s in decoding if s.status is Status.RUNNING), default=steps)
        return Decode(tuple(batch), max(1, min(steps, longest)))

    def _preempt(self, seq: Sequence) -> None:
        if self.on_preempt is not None:
            self.on_preempt(seq)
        self.blocks.release(seq)
        self.running.remove(seq)
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def decoded(self, seq: Sequence, fed: int) -> None:
        """``fed`` more positions of ``seq`` are now in its KV cache."""
        seq.num_computed += fed
        self.blocks.mark_computed(seq, since=seq.num_computed - fed)

    def finish(self, seq: Sequence) -> None:
        seq.status = Status.FINISHED
        self.running.remove(seq)
        if self.cfg.policy == "static":
            self.held.append(seq)
            if not self.running:
                for s in self.held:
                    self.blocks.release(s)
                self.held.clear()
        else:
            self.blocks.release(seq)
