"""The rollout engine: batched generation with a KV cache, reporting what RL needs.

``Engine(checkpoint_dir)`` loads a BF16 or quantized checkpoint; ``generate`` returns,
per prompt, the response tokens, the logprob of each (full vocabulary, at the sampling
temperature, before truncation), the finish reason, and for MoE models the experts
each MoE layer chose at every position the trainer will process ([P + R - 1,
moe_layers, top_k]): the prompt's P positions and every response token but the last.
``load_weights`` updates weights in place for the weight sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from quantroll.engine.kv_cache import KVCache, kv_cache_bytes
from quantroll.engine.sampling import SamplingParams, sample
from quantroll.errors import QuantrollError
from quantroll.formats import QuantizedTensor
from quantroll.model.linear import QLinear
from quantroll.model.loader import load_model
from quantroll.model.moe import RecordRouting


@dataclass(frozen=True)
class GenerationResult:
    prompt_tokens: list[int]
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token, included in tokens) or "length"
    routed_experts: torch.Tensor | None  # int16/int32 [P + R - 1, moe_layers, top_k], MoE only
    weight_version: int


def _stop_ids(checkpoint_dir: Path, config_eos: tuple[int, ...]) -> tuple[int, ...]:
    ids = set(config_eos)
    gen = checkpoint_dir / "generation_config.json"
    if gen.is_file():
        import json

        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
    return tuple(sorted(ids))


class Engine:
    def __init__(self, checkpoint_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16):
        self.checkpoint_dir = Path(checkpoint_dir)
        self.device = torch.device(device)
        self.dtype = dtype
        self.model, self.format = load_model(self.checkpoint_dir, self.device, dtype)
        self.config = self.model.config
        self.default_stop_ids = _stop_ids(self.checkpoint_dir, self.config.eos_token_ids)
        self.weight_version = 0
        self._params = dict(self.model.named_parameters())
        self._linears = {m.name: m for m in self.model.modules() if isinstance(m, QLinear) and m.quantized}

    @property
    def precision(self) -> str:
        """What the engine computes in, as reports should print it ("fp8 (emulated)" ...)."""
        if self.format is None:
            return str(self.dtype).replace("torch.", "")
        backends = {layer.backend for layer in self._linears.values()}
        return f"{self.format.name} ({'emulated' if backends == {'emulated'} else '+'.join(sorted(backends))})"

    # -- generation -------------------------------------------------------------------
    def _check(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> None:
        if not prompts:
            raise QuantrollError("generate() got no prompts")
        context = self.config.max_position_embeddings
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise QuantrollError(f"prompt {i} is empty; every prompt needs at least one token")
            if min(p) < 0 or max(p) >= self.config.vocab_size:
                raise QuantrollError(f"prompt {i} holds token ids outside [0, {self.config.vocab_size})")
            if len(p) + params.max_new_tokens > context:
                raise QuantrollError(
                    f"prompt {i} has {len(p)} tokens; with max_new_tokens={params.max_new_tokens} it needs "
                    f"{len(p) + params.max_new_tokens} positions but the model's context is {context}; "
                    "shorten the prompt or lower max_new_tokens")

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams()) -> list[GenerationResult]:
        self._check(prompts, params)
        batch = len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        seq_len = int(lengths.max()) + params.max_new_tokens
        try:
            return self._generate(prompts, params, batch, lengths, seq_len)
        except torch.OutOfMemoryError:
            gib = kv_cache_bytes(self.config, batch, seq_len, self.dtype) / 2**30
            raise QuantrollError(
                f"out of GPU memory generating {batch} sequences of up to {seq_len} tokens "
                f"(KV cache {gib:.2f} GiB); lower the batch size or max_new_tokens") from None

    def _generate(self, prompts, params, batch, lengths, seq_len) -> list[GenerationResult]:
        cfg, dev = self.config, self.device
        stop = torch.tensor(params.stop_token_ids if params.stop_token_ids is not None else self.default_stop_ids,
                            dtype=torch.long, device=dev)
        cache = KVCache(cfg, batch, seq_len, self.dtype, dev)
        p_max = int(lengths.max())
        ids = torch.zeros(batch, p_max, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, device=dev)
        positions = torch.arange(p_max, device=dev).expand(batch, p_max)
        moe = bool(cfg.moe_layers)
        prefill_routing = RecordRouting() if moe else None
        cache.positions = positions
        hidden = self.model.hidden(ids, positions, cache.attend, prefill_routing)
        rows = torch.arange(batch, device=dev)
        logits = self.model.logits(hidden[rows, lengths - 1])
        seeds = params.seed + rows.to(torch.int64)
        token, logprob = sample(logits, params, seeds, lengths)
        tokens, logprobs = [token], [logprob]
        done = torch.isin(token, stop)
        decode_routing: list[RecordRouting] = []
        position = lengths.clone()  # where the token just sampled sits
        for _ in range(params.max_new_tokens - 1):
            if bool(done.all()):
                break
            cache.positions = position[:, None]
            step_routing = RecordRouting() if moe else None
            hidden = self.model.hidden(token[:, None], position[:, None], cache.attend, step_routing)
            if moe:
                decode_routing.append(step_routing)
            token, logprob = sample(self.model.logits(hidden[:, 0]), params, seeds, position + 1)
            position = position + 1
            tokens.append(token)
            logprobs.append(logprob)
            done = done | torch.isin(token, stop)
        return self._results(prompts, torch.stack(tokens, 1), torch.stack(logprobs, 1), stop, prefill_routing,
                             decode_routing, p_max, params)

    def _results(self, prompts, tokens, logprobs, stop, prefill_routing, decode_routing, p_max, params):
        tokens, logprobs = tokens.cpu(), logprobs.cpu()
        is_stop = torch.isin(tokens, stop.cpu())
        routes = self._routes(prefill_routing, decode_routing, len(prompts), p_max) if prefill_routing else None
        out = []
        for i, prompt in enumerate(prompts):
            hits = is_stop[i].nonzero()
            n = int(hits[0]) + 1 if len(hits) else tokens.shape[1]
            finish = "stop" if len(hits) else "length"
            experts = None
            if routes is not None:
                prefill, decode = routes
                experts = torch.cat([prefill[i, : len(prompt)], decode[i, : n - 1]], dim=0)
            out.append(GenerationResult(list(prompt), tokens[i, :n].tolist(), logprobs[i, :n].tolist(), finish,
                                        experts, self.weight_version))
        return out

    def _routes(self, prefill_routing, decode_routing, batch, p_max):
        """Expert ids as ([B, p_max, L, k], [B, steps, L, k]) in a compact integer type."""
        layers = self.config.moe_layers
        small = torch.int16 if self.config.num_experts <= torch.iinfo(torch.int16).max else torch.int32
        k = self.config.num_experts_per_tok
        prefill = torch.stack([prefill_routing.chosen[layer].view(batch, p_max, k) for layer in layers], dim=2)
        if decode_routing:
            decode = torch.stack([torch.stack([r.chosen[layer] for layer in layers], dim=1) for r in decode_routing], dim=1)
        else:
            decode = torch.empty(batch, 0, len(layers), k, dtype=prefill.dtype, device=prefill.device)
        return prefill.to(small).cpu(), decode.to(small).cpu()

    # -- weight updates ---------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor | QuantizedTensor]]) -> int:
        """Update weights in place: a plain tensor for a BF16 parameter; for a quantized
        layer ``name.weight`` either a QuantizedTensor (data + scale, loaded as is) or
        a BF16 tensor (quantized here by the layer's format). Returns the new version."""
        for name, value in named_tensors:
            module = name.removesuffix(".weight")
            if module in self._linears and name.endswith(".weight"):
                layer = self._linears[module]
                q = value if isinstance(value, QuantizedTensor) else layer.format.quantize_weight(value.to(self.device), name)
                if q.format != layer.format.name or tuple(q.shape) != (layer.out_features, layer.in_features):
                    raise QuantrollError(f"load_weights: '{name}' is {q.format} {tuple(q.shape)}, the engine holds "
                                         f"{layer.format.name} {(layer.out_features, layer.in_features)}")
                layer.load_quantized_(q)
            elif name in self._params:
                target = self._params[name]
                if isinstance(value, QuantizedTensor) or tuple(value.shape) != tuple(target.shape):
                    raise QuantrollError(f"load_weights: '{name}' does not match the engine's {tuple(target.shape)} "
                                         f"{target.dtype} parameter")
                target.copy_(value)
            else:
                raise QuantrollError(f"load_weights: the engine has no weight named '{name}'")
        self.weight_version += 1
        return self.weight_version
