"""All of the engine's device state: the KV pool, the routes pool, the decode graphs.

The scheduler says what to run; this module turns it into tensors and forward passes:

- ``prefill``: the chunks of several sequences flattened into one row of tokens, each
  token's key/value written at its slot, the first token sampled for every sequence
  whose prompt this pass completes.
- ``decode``: ``steps`` steps of one token per sequence with no host synchronization in
  between. On a GPU each step is a CUDA graph replay; one graph per batch-size bucket
  and sampling setting, captured at its first use and
  replayed for every later call, across ``load_weights`` too (weights are updated in
  place). The buckets are powers of two up to 32, then multiples of 32 (``bucket_for``).
  The step computes each row's slot from its position and block table on the device, so
  positions advance inside the graph; a row past its last needed position (``limits``)
  and the padding rows of a bucket write to the scratch block.

MoE: every forward pass writes each token's experts into a routes pool indexed like the
KV slots, so a sequence's routed experts are read back through its block table, shared
prefix positions included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from quantroll.engine.block_manager import SCRATCH_BLOCK, blocks_for
from quantroll.engine.paged_cache import AttentionBatch, PagedKVCache
from quantroll.engine.sampling import SamplingParams, sample
from quantroll.engine.scheduler import PrefillChunk
from quantroll.engine.sequence import Sequence
from quantroll.model.kernel_config import DEFAULT_KERNELS, KernelConfig
from quantroll.model.moe import Routing


class RouteWriter(Routing):
    """Chooses top-k as usual and writes each MoE layer's choice at the tokens' slots."""

    def __init__(self, pool: torch.Tensor, slots: torch.Tensor, moe_layers: tuple[int, ...]):
        self.pool, self.slots = pool, slots
        self.column = {layer: i for i, layer in enumerate(moe_layers)}

    def chose(self, layer_idx, idx):
        self.pool.select(1, self.column[layer_idx]).index_copy_(0, self.slots, idx.to(self.pool.dtype))
        return idx


def bucket_for(n: int, largest: int) -> int:
    """The decode batch a running set of ``n`` sequences replays in: powers of two up to 32,
    then multiples of 32 (padding at most 31 rows where the linears start to cost by the
    row), never beyond ``largest`` (max_num_seqs) unless n itself is."""
    b = 1
    while b < n and b < 32:
        b *= 2
    if b < n:
        b = -(-n // 32) * 32
    return max(min(b, largest), n)


@dataclass
class DecodeState:
    """Static buffers of one decode bucket (the graph's inputs and outputs)."""

    tokens: torch.Tensor  # [b] the token each row feeds
    positions: torch.Tensor  # [b] its position
    limits: torch.Tensor  # [b] last position a row writes for real (beyond: scratch)
    tables: torch.Tensor  # [b, max_blocks] int32
    seeds: torch.Tensor  # [b] int64
    step: torch.Tensor  # [1] index of the next output
    out_tokens: torch.Tensor  # [steps, b]
    out_logprobs: torch.Tensor  # [steps, b]
    batch: AttentionBatch
    graph: torch.cuda.CUDAGraph | None = None


class ModelRunner:
    def __init__(self, model, cache: PagedKVCache, device: torch.device, route_dtype: torch.dtype, use_graphs: bool,
                 max_blocks_per_seq: int, max_decode_steps: int, kernels: KernelConfig = DEFAULT_KERNELS):
        self.model, self.cache, self.device = model, cache, torch.device(device)
        self.kernels = kernels  # the sampler's log-softmax follows the model's kernels
        cfg = model.config
        self.moe_layers = tuple(cfg.moe_layers)
        self.block_size = cache.block_size
        self.use_graphs = use_graphs
        self.max_blocks = max_blocks_per_seq
        self.max_steps = max_decode_steps
        self.routes = None
        if self.moe_layers:
            self.routes = torch.zeros(cache.num_blocks * cache.block_size, len(self.moe_layers), cfg.num_experts_per_tok,
                                      dtype=route_dtype, device=device)
        self.states: dict[tuple, DecodeState] = {}
        self.graph_pool = None
        self.captures = 0
        self.events: list[tuple[str, object, object]] = []
        # per decode chunk: (sequences, bucket rows, steps, sum of the sequences' keys at its first step)
        self.trace: list[tuple[int, int, int, int]] = []

    # -- timing ---------------------------------------------------------------------------
    def _mark(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        import time

        return time.perf_counter()

    def take_timings(self) -> dict[str, float]:
        """Milliseconds spent in prefill and decode since the last call (one sync)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out = {"prefill_ms": 0.0, "decode_ms": 0.0}
        for kind, a, b in self.events:
            out[f"{kind}_ms"] += a.elapsed_time(b) if self.device.type == "cuda" else (b - a) * 1e3
        self.events.clear()
        return out

    # -- helpers ----------------------------------------------------------------------------
    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _table_rows(self, seqs, width: int, rows: int | None = None) -> torch.Tensor:
        """[rows, width] int32: each sequence's block table padded with the scratch block
        (rows past the sequences: scratch only). A decode chunk does this for every running
        sequence while the GPU waits: numpy takes a row's list at C speed (512 tables of ~270
        blocks: 2.4 ms, against 10.8 with a tensor per row and 17.8 as one nested list)."""
        table = np.full((rows or len(seqs), width), SCRATCH_BLOCK, dtype=np.int32)
        for i, seq in enumerate(seqs):
            blocks = seq.block_table[:width]
            table[i, :len(blocks)] = blocks
        return torch.from_numpy(table)

    def _routing(self, slots: torch.Tensor) -> Routing | None:
        return RouteWriter(self.routes, slots, self.moe_layers) if self.routes is not None else None

    # -- prefill ----------------------------------------------------------------------------
    def prefill(self, chunks: tuple[PrefillChunk, ...], params: SamplingParams) -> list[tuple[int, float] | None]:
        """Compute the chunks' positions; for each chunk, the (token, logprob) sampled when it
        completes a new sequence's prompt, else None."""
        start = self._mark()
        ids, positions, slots, starts = [], [], [], [0]
        for c in chunks:
            span = range(c.start, c.start + c.count)
            ids += [c.seq.token_at(p) for p in span]
            positions += list(span)
            slots += [self._slot(c.seq, p) for p in span]
            starts.append(len(ids))
        dev = self.device
        width = max(blocks_for(c.start + c.count, self.block_size) for c in chunks)
        self.cache.batch = AttentionBatch(
            slots=torch.tensor(slots, dtype=torch.long).to(dev),
            block_tables=self._table_rows([c.seq for c in chunks], width).to(dev),
            context_lens=torch.tensor([c.start + c.count for c in chunks], dtype=torch.int32).to(dev),
            query_starts=torch.tensor(starts, dtype=torch.int32).to(dev),
            max_query=max(c.count for c in chunks), max_context=max(c.start + c.count for c in chunks))
        ids_t = torch.tensor(ids, dtype=torch.long).to(dev)[None]
        pos_t = torch.tensor(positions, dtype=torch.long).to(dev)[None]
        hidden = self.model.hidden(ids_t, pos_t, self.cache, self._routing(self.cache.batch.slots))[0]
        sampling = [i for i, c in enumerate(chunks) if c.completes and c.seq.samples_after_prefill]
        out: list[tuple[int, float] | None] = [None] * len(chunks)
        if sampling:
            last = torch.tensor([starts[i + 1] - 1 for i in sampling], device=dev)
            seeds = torch.tensor([chunks[i].seq.seed for i in sampling], dtype=torch.int64, device=dev)
            where = torch.tensor([chunks[i].seq.prefill_target for i in sampling], dtype=torch.int64, device=dev)
            token, logprob = sample(self.model.logits(hidden[last]), params, seeds, where, self.kernels)
            for i, t, lp in zip(sampling, token.tolist(), logprob.tolist()):
                out[i] = (t, lp)
        self.events.append(("prefill", start, self._mark()))
        return out

    # -- decode -----------------------------------------------------------------------------
    def _new_state(self, b: int, steps: int) -> DecodeState:
        dev = self.device
        slots = torch.zeros(b, dtype=torch.long, device=dev)
        tables = torch.zeros(b, self.max_blocks, dtype=torch.int32, device=dev)
        context = torch.ones(b, dtype=torch.int32, device=dev)
        return DecodeState(
            tokens=torch.zeros(b, dtype=torch.long, device=dev), positions=torch.zeros(b, dtype=torch.long, device=dev),
            limits=torch.full((b,), -1, dtype=torch.long, device=dev), tables=tables,
            seeds=torch.zeros(b, dtype=torch.int64, device=dev), step=torch.zeros(1, dtype=torch.long, device=dev),
            out_tokens=torch.zeros(steps, b, dtype=torch.long, device=dev),
            out_logprobs=torch.zeros(steps, b, dtype=torch.float32, device=dev),
            batch=AttentionBatch(slots, tables, context, None))

    def _step(self, st: DecodeState, params: SamplingParams) -> None:
        bs = self.block_size
        pos = st.positions
        column = (pos // bs).clamp(max=self.max_blocks - 1)[:, None]
        real = st.tables.gather(1, column)[:, 0].long() * bs + pos % bs
        st.batch.slots.copy_(torch.where(pos <= st.limits, real, SCRATCH_BLOCK * bs + pos % bs))
        # a row past its cap (its tokens are thrown away) may run past the table's last column at
        # the model's full context: the GPU kernels read the table unbounded, so its context stops there
        st.batch.context_lens.copy_((pos + 1).clamp_(max=self.max_blocks * bs))
        self.cache.batch = st.batch
        hidden = self.model.hidden(st.tokens[:, None], pos[:, None], self.cache, self._routing(st.batch.slots))
        token, logprob = sample(self.model.logits(hidden[:, 0]), params, st.seeds, pos + 1, self.kernels)
        st.out_tokens.index_copy_(0, st.step, token[None])
        st.out_logprobs.index_copy_(0, st.step, logprob[None])
        st.tokens.copy_(token)
        st.positions += 1
        st.step += 1

    def _state(self, n: int, params: SamplingParams, largest: int) -> DecodeState:
        b = bucket_for(n, largest) if self.use_graphs else n
        key = (b, params.temperature, params.top_p, params.top_k) if self.use_graphs else ("eager", b)
        st = self.states.get(key)
        if st is None:
            st = self._new_state(b, self.max_steps)
            if self.use_graphs:
                self._capture(st, params)
            self.states[key] = st
        return st

    def _capture(self, st: DecodeState, params: SamplingParams) -> None:
        """Warm up (compiles kernels) and capture one step on scratch inputs: every row writes
        to the scratch block, so nothing real is touched."""
        self._step(st, params)
        torch.cuda.synchronize(self.device)
        if self.graph_pool is None:
            self.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            self._step(st, params)
        st.graph = graph
        self.captures += 1

    def decode(self, seqs: tuple[Sequence, ...], steps: int, params: SamplingParams, largest: int
               ) -> tuple[list[list[int]], list[list[float]]]:
        """``steps`` tokens for each sequence (rows past a sequence's end hold garbage):
        (tokens [n][steps], logprobs [n][steps])."""
        start = self._mark()
        n = len(seqs)
        st = self._state(n, params, largest)
        b = st.tokens.shape[0]
        # the rows as Python lists, one tensor each (element writes cost ~1 us apiece, 4 per row);
        # padding rows: token 0 at position 0, limit -1 (every step writes to the scratch block)
        pad = [0] * (b - n)
        positions = [seq.num_computed for seq in seqs]
        host = torch.tensor([[seq.tokens[-1] for seq in seqs] + pad, positions + pad,
                             [c + min(steps, max(seq.remaining, 0)) - 1 for c, seq in zip(positions, seqs)]
                             + [-1] * (b - n), [seq.seed for seq in seqs] + pad], dtype=torch.long)
        width = self.max_blocks if self.use_graphs else max(len(s.block_table) for s in seqs)
        for dst, src in ((st.tokens, host[0]), (st.positions, host[1]), (st.limits, host[2]), (st.seeds, host[3]),
                         (st.tables[:, :width], self._table_rows(seqs, width, b))):
            dst.copy_(src.to(self.device, non_blocking=True))
        st.step.zero_()
        first = max(positions)
        self.trace.append((n, b, steps, sum(positions) + n))
        for s in range(steps):
            if st.graph is not None:
                st.graph.replay()
            else:
                st.batch.max_context = min(first + s + 1, self.max_blocks * self.block_size)  # as _step clamps
                self._step(st, params)
        # contiguous before tolist: a transposed tensor's tolist walks it element by element
        # (1.7 ms for 8 x 512 tokens and logprobs here, against 0.2)
        out_t = st.out_tokens[:steps, :n].t().contiguous().tolist()
        out_lp = st.out_logprobs[:steps, :n].t().contiguous().tolist()
        self.events.append(("decode", start, self._mark()))
        return out_t, out_lp

    def capture_all(self, params: SamplingParams, largest: int) -> None:
        """Capture every bucket up to ``largest`` now (largest first, so that the smaller
        ones reuse its memory pool), instead of at each bucket's first use."""
        if not self.use_graphs:
            return
        sizes = sorted({bucket_for(n, largest) for n in range(1, largest + 1)}, reverse=True)
        for b in sizes:
            self._state(b, params, largest)

    # -- MoE routes -------------------------------------------------------------------------
    def _routes_rows(self, seq: Sequence, n: int) -> torch.Tensor:
        slots = torch.tensor([self._slot(seq, p) for p in range(n)], dtype=torch.long, device=self.device)
        return self.routes[slots].cpu()

    def save_routes(self, seq: Sequence) -> None:
        """Before a preemption drops ``seq``'s blocks: keep the routes its tokens were sampled with."""
        if self.routes is None or seq.num_computed == 0:
            return
        rows = self._routes_rows(seq, seq.num_computed)
        if seq.saved_routes is not None:
            rows[: len(seq.saved_routes)] = seq.saved_routes
        seq.saved_routes = rows

    def routes_of(self, seq: Sequence) -> torch.Tensor | None:
        """[P + R - 1, moe_layers, top_k]: the experts of every position the trainer processes."""
        if self.routes is None:
            return None
        rows = self._routes_rows(seq, seq.length - 1)
        if seq.saved_routes is not None:
            keep = min(len(seq.saved_routes), len(rows))
            rows[:keep] = seq.saved_routes[:keep]
        return rows
