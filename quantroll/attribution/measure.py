"""Gaps and divergences of a hybrid model on fixed sampled responses.

The responses of each seed are sampled once, by the engine on the full conversion (what
a rollout at that precision produces), and every measurement scores those same tokens:
the BF16 model gives the trainer's logprobs, the hybrid with a chosen set of linears in
the rollout format gives the rollout's. With every linear low precision this is the
step-0 gap a ``train`` run measures (tested against the engine's own logprobs); with a
subset it is the gap that subset would cause on those tokens (common samples for every
subset, so that differences between subsets are not sampling noise).

``gap(low, routing)``: ``routing`` "own" lets each MoE router choose from its (low-
precision) input; "bf16" replays the BF16 model's choices (what the gap would be if
routing never flipped); "full" replays the full conversion's choices into the given
model (the gap routing flips alone carry).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.attribution.divergence import gap, routing_flips, squared_sums
from quantroll.attribution.hybrid import Hybrid
from quantroll.attribution.units import cell_of
from quantroll.model.moe import RecordRouting, ReplayRouting
from quantroll.trainer.policy import response_logprobs


@dataclass(frozen=True)
class Batch:
    """One seed's prompts and the responses the full-conversion engine sampled for them."""

    seed: int
    prompts: list[list[int]]
    responses: list[list[int]]
    engine_logprobs: torch.Tensor  # [B, R] zero-padded, as the engine reported them


def valid_positions(prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
    """[B, L] bool: the positions the trainer's forward processes (prompt + response[:-1])."""
    lengths = [len(p) + len(r) - 1 for p, r in zip(prompts, responses)]
    width = max(lengths)
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


@dataclass(frozen=True)
class CheapEstimates:
    """One forward per precision and seed: no ablation."""

    hidden_divergence: list[float]  # per layer: ||h_lp - h_bf16|| / ||h_bf16|| after the layer (full conversion)
    local_error: dict  # cell -> relative output error of its linears, fed the BF16 model's own inputs
    layer_local_error: dict  # layer -> the same over the layer's linears
    routing_flips: dict  # MoE layer -> share of tokens whose top-k set differs (full conversion vs BF16)


class Measurer:
    def __init__(self, hybrid: Hybrid, batches: list[Batch], temperature: float):
        self.hybrid, self.batches, self.temperature = hybrid, batches, temperature
        self.moe = bool(hybrid.model.config.num_experts)
        self.all_modules = frozenset(hybrid.quantized)
        self._cache: dict[tuple, list[float]] = {}
        self._ref = []  # per batch: (BF16 logp, mask, BF16 routing choices)
        self._full_routing: list[dict | None] = [None] * len(batches)
        self.forwards = 0
        for b in batches:
            rec = RecordRouting() if self.moe else None
            with torch.no_grad():
                logp, mask = response_logprobs(hybrid.model, b.prompts, b.responses, temperature, routing=rec)
            self._ref.append((logp, mask, rec.chosen if rec else None))

    def _logprobs(self, i: int, low: frozenset, routing: str):
        b = self.batches[i]
        rec, replay = None, None
        if self.moe and routing == "bf16":
            replay = ReplayRouting(self._ref[i][2])
        elif self.moe and routing == "full":
            replay = ReplayRouting(self.full_routing(i))
        elif self.moe:
            rec = RecordRouting()
        with torch.no_grad(), self.hybrid.low_precision(sorted(low)) as model:
            logp, _ = response_logprobs(model, b.prompts, b.responses, self.temperature, routing=replay or rec)
        self.forwards += 1
        if rec is not None and low == self.all_modules:
            self._full_routing[i] = rec.chosen
        return logp

    def full_routing(self, i: int) -> dict:
        if self._full_routing[i] is None:
            self._logprobs(i, self.all_modules, "own")
        return self._full_routing[i]

    def gap(self, low, routing: str = "own") -> list[float]:
        """The gap per seed with exactly the modules ``low`` in the rollout format."""
        low = frozenset(low)
        key = (low, routing if self.moe else "own")
        if key not in self._cache:
            values = []
            for i in range(len(self.batches)):
                ref, mask, _ = self._ref[i]
                values.append(gap(ref, self._logprobs(i, low, key[1]), mask) if low or key[1] == "full" else 0.0)
            self._cache[key] = values
        return self._cache[key]

    def engine_gap(self) -> list[float]:
        """The gap against the engine's own reported logprobs (the check that the hybrid
        with every linear low precision is the rollout)."""
        return [gap(ref, b.engine_logprobs, mask) for b, (ref, mask, _) in zip(self.batches, self._ref)]

    def cheap(self) -> CheapEstimates:
        model = self.hybrid.model
        layers = list(model.model.layers)
        sums_cell: dict = {}
        div = [[0.0, 0.0] for _ in layers]
        flips: dict[int, list[float]] = {}
        for i, b in enumerate(self.batches):
            valid = valid_positions(b.prompts, b.responses)
            bf16_out, inputs, outputs = _capture(model, layers, self.hybrid, b, self.temperature)
            with self.hybrid.low_precision(sorted(self.all_modules)) as lp:
                lp_out, _, _ = _capture(lp, layers, None, b, self.temperature)
            for n, (a, ref) in enumerate(zip(lp_out, bf16_out)):
                num, den = squared_sums(a, ref, valid)
                div[n][0] += num
                div[n][1] += den
            with torch.no_grad():
                for name, x in inputs.items():
                    y_lp = self.hybrid.quantized[name](x)
                    num, den = squared_sums(y_lp, outputs[name])
                    acc = sums_cell.setdefault(cell_of(name), [0.0, 0.0])
                    acc[0] += num
                    acc[1] += den
            if self.moe:
                ref_choice, full_choice = self._ref[i][2], self.full_routing(i)
                for layer, idx in ref_choice.items():
                    flips.setdefault(layer, []).append(routing_flips(full_choice[layer], idx, valid.reshape(-1)))
        local = {c: _ratio(*v) for c, v in sums_cell.items()}
        per_layer: dict[int, list[float]] = {}
        for (layer, _), v in sums_cell.items():
            acc = per_layer.setdefault(layer, [0.0, 0.0])
            acc[0] += v[0]
            acc[1] += v[1]
        return CheapEstimates([_ratio(*d) for d in div], local, {k: _ratio(*v) for k, v in sorted(per_layer.items())},
                              {k: sum(v) / len(v) for k, v in sorted(flips.items())})


def _ratio(num: float, den: float) -> float:
    return 0.0 if den == 0 and num == 0 else (num / den) ** 0.5 if den else float("inf")


def _capture(model, layers, hybrid: Hybrid | None, b: Batch, temperature: float):
    """One forward pass recording each decoder layer's output and (when ``hybrid`` is given)
    the input and output of every BF16 linear the conversion quantizes."""
    outs: list[torch.Tensor] = [None] * len(layers)
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}
    handles = []

    def keep_layer(n):
        def hook(_module, _args, out):
            outs[n] = out.detach()
        return hook

    def keep_linear(name):
        def hook(_module, args, out):
            x = args[0].detach()
            inputs[name] = torch.cat([inputs[name], x.reshape(-1, x.shape[-1])]) if name in inputs else x.reshape(-1, x.shape[-1])
            y = out.detach().reshape(-1, out.shape[-1])
            outputs[name] = torch.cat([outputs[name], y]) if name in outputs else y
        return hook

    for n, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(keep_layer(n)))
    if hybrid is not None:
        for name in hybrid.quantized:
            handles.append(hybrid.bf16_linear(name).register_forward_hook(keep_linear(name)))
    try:
        with torch.no_grad():
            response_logprobs(model, b.prompts, b.responses, temperature)
    finally:
        for h in handles:
            h.remove()
    return outs, inputs, outputs
