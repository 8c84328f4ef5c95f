"""The decode loop: one token per sequence per step, eager or replayed as a CUDA graph.

All per-step state lives in static tensors (the token fed, its position, the done
flags, a step counter) and every output is written in place at the step's index, so
one captured step replays for the whole response with no host synchronization per
token: the host looks at the done flags once every ``check_every`` steps.
"""

from __future__ import annotations

import torch

from quantroll.engine.kv_cache import KVCache
from quantroll.engine.sampling import SamplingParams, sample
from quantroll.model.moe import Routing


class BufferRouting(Routing):
    """Chooses top-k as usual and writes each MoE layer's choice into routes[step]."""

    def __init__(self, routes: torch.Tensor, step: torch.Tensor, moe_layers: tuple[int, ...]):
        self.routes, self.step = routes, step
        self.slot = {layer: i for i, layer in enumerate(moe_layers)}

    def chose(self, layer_idx, idx):
        self.routes.select(2, self.slot[layer_idx]).index_copy_(0, self.step, idx.to(self.routes.dtype)[None])
        return idx


class DecodeLoop:
    def __init__(self, model, cache: KVCache, params: SamplingParams, stop: torch.Tensor, seeds: torch.Tensor,
                 first_token: torch.Tensor, first_logprob: torch.Tensor, position: torch.Tensor,
                 route_dtype: torch.dtype, use_graph: bool, check_every: int = 16):
        cfg = model.config
        n, b, dev = params.max_new_tokens, first_token.shape[0], first_token.device
        self.model, self.cache, self.params, self.stop, self.seeds = model, cache, params, stop, seeds
        self.token = first_token.clone()
        self.position = position.clone()  # where self.token sits
        self.done = torch.isin(first_token, stop)
        self.step = torch.ones(1, dtype=torch.long, device=dev)  # index the next sample is written at
        self.tokens = torch.zeros(n, b, dtype=torch.long, device=dev)
        self.logprobs = torch.zeros(n, b, dtype=torch.float32, device=dev)
        self.tokens[0], self.logprobs[0] = first_token, first_logprob
        self.routes = None
        self.routing = None
        if cfg.moe_layers:
            # routes[s] holds the experts chosen for the token fed at decode step s (response token s)
            self.routes = torch.zeros(n, b, len(cfg.moe_layers), cfg.num_experts_per_tok, dtype=route_dtype, device=dev)
            self.routing = BufferRouting(self.routes, self.step - 1, cfg.moe_layers)
        self.use_graph, self.check_every = use_graph, check_every
        self.graph: torch.cuda.CUDAGraph | None = None
        self.replays = 0

    def _step(self) -> None:
        self.cache.positions = self.position[:, None]
        if self.routing is not None:
            self.routing.step = self.step - 1
        hidden = self.model.hidden(self.token[:, None], self.position[:, None], self.cache, self.routing)
        token, logprob = sample(self.model.logits(hidden[:, 0]), self.params, self.seeds, self.position + 1)
        self.tokens.index_copy_(0, self.step, token[None])
        self.logprobs.index_copy_(0, self.step, logprob[None])
        self.done |= torch.isin(token, self.stop)
        self.token.copy_(token)
        self.position += 1
        self.step += 1

    def run(self, timer=None) -> int:
        """Decode until every sequence stopped or max_new_tokens; returns tokens per row written.

        With a timer, marks "replays_start" once the graph is captured and "end" at the
        end, so that the step time excludes compilation and capture."""
        n = self.params.max_new_tokens
        steps = 1
        self.replays = 0
        while steps < n:
            if (steps - 1) % self.check_every == 0 and bool(self.done.all()):
                break
            if self.graph is not None:
                self.graph.replay()
                self.replays += 1
            else:
                self._step()
                if self.use_graph and steps == 1:  # first step eager: compiles kernels, then capture
                    self._capture()
                    if timer is not None:
                        timer.mark("replays_start")
            steps += 1
        if timer is not None:
            timer.mark("end")
        return steps

    def _capture(self) -> None:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step()
        self.graph = graph
