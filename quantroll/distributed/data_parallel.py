"""Several engines, data-parallel: one rollout batch split across them, the results
gathered back in prompt order.

Each engine takes a contiguous share of the prompts (``share``) and samples prompt i
with the seed it has in one engine (``params.seed + i``: the engine's sampler draws its
noise from a hash of (sequence seed, position), so a sequence's tokens depend on its seed,
its prompt and the weights, never on which engine ran it or what ran beside it). Greedy
samples are therefore identical to one engine's, and sampled ones too, up to the rounding
of batch-variant kernels.

What crosses between ranks is tensors: per sequence its response tokens, logprobs
(float64, the exact Python floats the engine returned), finish reason, weight version,
preemptions and, for MoE, the routed experts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from quantroll.distributed.collectives import agree, all_gather_varlen, all_sum
from quantroll.distributed.context import DistContext
from quantroll.engine.sampling import SEED_LIMIT, SamplingParams

FINISH_REASONS = ("stop", "length")
COUNTERS = ("preemptions", "prefill_tokens", "prefill_tokens_saved", "peak_blocks_used", "decode_steps")


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous share of n items; shares differ by at most one."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def pack(results, moe_layers: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int64 [header..., tokens...], float64 logprobs, int32 routes) of this rank's results."""
    head, tokens, logprobs, routes = [len(results)], [], [], []
    for r in results:
        has_routes = r.routed_experts is not None
        head += [len(r.prompt_tokens), len(r.tokens), FINISH_REASONS.index(r.finish_reason), r.weight_version,
                 r.preemptions, int(has_routes)]
        tokens += r.tokens
        logprobs += r.logprobs
        if has_routes:
            routes.append(r.routed_experts.to(torch.int32).reshape(-1))
    ints = torch.tensor(head + tokens, dtype=torch.int64)
    route_tensor = torch.cat(routes) if routes else torch.zeros(0, dtype=torch.int32)
    return ints, torch.tensor(logprobs, dtype=torch.float64), route_tensor


def unpack(ints: torch.Tensor, logprobs: torch.Tensor, routes: torch.Tensor, prompts: Sequence[Sequence[int]],
           moe_layers: int, top_k: int, route_dtype: torch.dtype) -> list:
    """The inverse of ``pack``, given the prompts of those results (every rank has them)."""
    from quantroll.engine.engine import GenerationResult

    values = ints.tolist()
    n, fields = values[0], 6
    tok_at, lp_at, route_at, out = 1 + n * fields, 0, 0, []
    lps = logprobs.tolist()
    for i in range(n):
        p_len, r_len, reason, version, preemptions, has_routes = values[1 + i * fields: 1 + (i + 1) * fields]
        toks = values[tok_at: tok_at + r_len]
        tok_at += r_len
        seq_lps = lps[lp_at: lp_at + r_len]
        lp_at += r_len
        experts = None
        if has_routes:
            size = (p_len + r_len - 1) * moe_layers * top_k
            experts = routes[route_at: route_at + size].view(p_len + r_len - 1, moe_layers, top_k).to(route_dtype)
            route_at += size
        out.append(GenerationResult(list(prompts[i]), toks, seq_lps, FINISH_REASONS[reason], experts, version,
                                    preemptions))
    return out


class DataParallelEngines:
    """This rank's engine seen as the whole set: ``generate`` takes the full batch on every
    rank and returns every result on every rank. Every rank must call it with the same
    prompts and parameters. What the RL loop asks of its engines and nothing more
    (``generate``, ``last_stats``, ``precision``, ``kv_cache_label``, as ``Engine`` and
    engine_ranks.RemoteEngines answer them); anything else is asked of ``engine`` itself."""

    def __init__(self, engine, ctx: DistContext):
        self.engine, self.ctx = engine, ctx
        self.last_stats: dict = {}

    @property
    def precision(self) -> str:
        return self.engine.precision  # every engine rank builds the same engine

    @property
    def kv_cache_label(self) -> str:
        return self.engine.kv_cache_label

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams(),
                 max_new_tokens: Sequence[int] | None = None) -> list:
        start, stop = share(len(prompts), self.ctx.rank, self.ctx.world_size)

        def mine() -> list:
            if stop <= start:
                return []
            caps = None if max_new_tokens is None else list(max_new_tokens)[start:stop]
            return self.engine.generate(list(prompts)[start:stop],
                                        replace(params, seed=(params.seed + start) % SEED_LIMIT), caps)

        local = agree(self.ctx, mine)  # an engine's refusal (a request it cannot serve) reaches every engine
        cfg = self.engine.config
        layers, top_k = len(cfg.moe_layers), cfg.num_experts_per_tok
        ints, lps, routes = pack(local, layers, top_k)
        gathered = zip(*(all_gather_varlen(self.ctx, t) for t in (ints, lps, routes)))
        results = []
        for rank, (i, lp, rt) in enumerate(gathered):
            lo, hi = share(len(prompts), rank, self.ctx.world_size)
            results += unpack(i, lp, rt, list(prompts)[lo:hi], layers, top_k, self.engine.route_dtype)
        self._gather_stats(bool(local))
        return results

    def _gather_stats(self, ran: bool) -> None:
        """The local engine's stats, with its counters summed over the engines."""
        stats = dict(self.engine.last_stats) if ran else {}
        sums = all_sum(self.ctx, [float(stats.get(k, 0.0)) for k in COUNTERS])
        stats.update(dict(zip(COUNTERS, sums)))
        self.last_stats = stats
