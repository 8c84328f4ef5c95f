"""The KV cache's bookkeeping: a fixed pool of blocks, reference counts, and a prefix cache.

Pure Python: which block holds which positions of which sequence. The tensors live in
``paged_cache.PagedKVCache``; a block id indexes its first dimension.

Prefix sharing: every full block of a prompt is named by a hash chain over its tokens
(and those of all blocks before it), so two sequences whose prompts start alike map
those positions to the same block, read-only, with a reference count. RL passes each
prompt n times (n samples); the first one computes the prompt, the others reuse its
blocks and compute only the rest. A block becomes shareable once its KV is written
(``ready``); a sequence whose prefix is still being written by another waits for it
(``PrefixPlan.pending``) rather than recomputing it. The block holding a prompt's last
position is never taken from the cache: that position must be computed, because its
logits give the sequence's first token. Freed blocks keep their content and name until
the pool reuses them (oldest first) or ``reset_prefix_cache`` forgets every name (the
engine does at each generate() call, so that a call's numbers depend on that call alone).

Block 0 is never handed out: padded rows of a decode batch, and positions a sequence
will not keep, write there.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from quantroll.engine.sequence import Sequence

SCRATCH_BLOCK = 0


@dataclass
class Block:
    ref_count: int = 0
    key: tuple | None = None  # (hash chain, tokens) naming the prompt prefix it holds, or None
    ready: bool = False  # its KV is written (only then may another sequence share it)


@dataclass(frozen=True)
class PrefixPlan:
    shared: tuple[int, ...]  # block ids to reuse for the sequence's first len(shared) blocks
    pending: bool  # a longer prefix is being written right now by another sequence: wait for it


def blocks_for(positions: int, block_size: int) -> int:
    return -(-positions // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_sharing: bool = True):
        if num_blocks < 2:
            raise ValueError(f"a KV pool needs at least 2 blocks (one is scratch), got {num_blocks}")
        self.block_size, self.num_blocks, self.prefix_sharing = block_size, num_blocks, prefix_sharing
        self.blocks = [Block() for _ in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self.by_key: dict[tuple, int] = {}
        self.peak_used = 0

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.usable_blocks - self.num_free

    def _keys(self, seq: Sequence) -> list[tuple]:
        """Names of the prompt's full blocks that may be shared: those wholly before the
        position the sequence must compute itself (prefill_target - 1)."""
        bs = self.block_size
        if not self.prefix_sharing:
            return []
        shareable = min(len(seq.prompt), seq.prefill_target - 1) // bs
        keys, chain = [], 0
        for i in range(shareable):
            tokens = tuple(seq.prompt[i * bs: (i + 1) * bs])
            chain = hash((chain, tokens))
            keys.append((chain, tokens))
        return keys

    def prefix_plan(self, seq: Sequence) -> PrefixPlan:
        shared = []
        for key in self._keys(seq):
            block = self.by_key.get(key)
            if block is None:
                break
            if not self.blocks[block].ready:
                return PrefixPlan(tuple(shared), pending=True)
            shared.append(block)
        return PrefixPlan(tuple(shared), pending=False)

    def blocks_to_admit(self, seq: Sequence, plan: PrefixPlan, extra_positions: int = 0) -> int:
        """Free blocks that admitting ``seq`` takes: new ones, and cached ones not in use."""
        total = blocks_for(seq.prefill_target + extra_positions, self.block_size)
        revived = sum(1 for b in plan.shared if self.blocks[b].ref_count == 0)
        return total - len(plan.shared) + revived

    def admit(self, seq: Sequence, plan: PrefixPlan, extra_positions: int = 0) -> bool:
        """Give ``seq`` blocks for its prefill (plus ``extra_positions``), reusing the plan's
        shared prefix; False (and nothing changed) when the pool is short."""
        if self.blocks_to_admit(seq, plan, extra_positions) > self.num_free:
            return False
        assert not seq.block_table, "admit() on a sequence that holds blocks"
        for b in plan.shared:
            self._share(b)
        seq.block_table = list(plan.shared)
        seq.num_computed = seq.num_shared = len(plan.shared) * self.block_size
        keys = self._keys(seq)
        while len(seq.block_table) < blocks_for(seq.prefill_target + extra_positions, self.block_size):
            i = len(seq.block_table)
            b = self._fresh()
            if i < len(keys) and keys[i] not in self.by_key:  # name it now, so others wait instead of recomputing
                self._name(b, keys[i])
            seq.block_table.append(b)
        self._note_peak()
        return True

    def grow(self, seq: Sequence, positions: int) -> bool:
        """Extend ``seq``'s table to hold positions [0, positions); False if the pool is short."""
        need = blocks_for(positions, self.block_size) - len(seq.block_table)
        if need <= 0:
            return True  # most decode chunks: the table already holds them (nothing to note)
        if need > self.num_free:
            return False
        for _ in range(need):
            seq.block_table.append(self._fresh())
        self._note_peak()
        return True

    def mark_computed(self, seq: Sequence, since: int = 0) -> None:
        """The KV of [0, seq.num_computed) is written: its full blocks may now be shared.
        ``since``: positions known written before (their full blocks were marked then), so
        that a decode chunk marks the one or two blocks it filled, not a 16K-token
        sequence's thousand blocks again for every chunk."""
        for b in seq.block_table[since // self.block_size: seq.num_computed // self.block_size]:
            self.blocks[b].ready = True

    def release(self, seq: Sequence) -> None:
        """Drop ``seq``'s references; blocks nobody holds return to the pool, keeping their
        name only if their content is complete."""
        for b in reversed(seq.block_table):
            block = self.blocks[b]
            block.ref_count -= 1
            if block.ref_count == 0:
                if not block.ready and block.key is not None:
                    del self.by_key[block.key]
                    block.key = None
                self.free[b] = None
        seq.block_table = []
        seq.num_computed = seq.num_shared = 0

    def reset_prefix_cache(self) -> None:
        """Forget every block's name (the weights changed: cached KV no longer matches)."""
        for block in self.blocks:
            block.key = None
        self.by_key.clear()

    def _share(self, b: int) -> None:
        if self.blocks[b].ref_count == 0:
            del self.free[b]
        self.blocks[b].ref_count += 1

    def _fresh(self) -> int:
        """The oldest free block, its old content and name dropped."""
        b, _ = self.free.popitem(last=False)
        block = self.blocks[b]
        if block.key is not None and self.by_key.get(block.key) == b:
            del self.by_key[block.key]
        block.key, block.ready, block.ref_count = None, False, 1
        return b

    def _name(self, b: int, key: tuple) -> None:
        self.blocks[b].key = key
        self.by_key[key] = b

    def _note_peak(self) -> None:
        self.peak_used = max(self.peak_used, self.num_used)
