"""The rollout engine: batched generation with a KV cache, reporting what RL needs.

``Engine(checkpoint_dir)`` loads a BF16 or quantized checkpoint; ``generate`` returns,
per prompt, the response tokens, the logprob of each (full vocabulary, at the sampling
temperature, before truncation), the finish reason, and for MoE models the experts
each MoE layer chose at every position the trainer will process ([P + R - 1,
moe_layers, top_k]): the prompt's P positions and every response token but the last.
``load_weights`` updates weights in place for the weight sync.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from quantroll.engine.decode import DecodeLoop
from quantroll.engine.kv_cache import KVCache, kv_cache_bytes
from quantroll.engine.request import check_request
from quantroll.engine.sampling import SamplingParams, sample
from quantroll.errors import QuantrollError
from quantroll.formats import QuantizedTensor
from quantroll.kernels import triton_available
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


class _Timer:
    """CUDA events (or host clocks on CPU) at named points; read once at the end."""

    def __init__(self, device: torch.device):
        import time

        self.cuda = device.type == "cuda"
        self._clock = time.perf_counter
        self.marks: list[tuple[str, object]] = [("start", self._now())]

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self._clock()

    def mark(self, name: str) -> None:
        self.marks.append((name, self._now()))

    def _ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def summary(self, steps: int, replays: int) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        t = dict(self.marks)
        stats = {"prefill_ms": self._ms(t["start"], t["prefill"]), "steps": steps, "graph_replays": replays}
        stats["decode_ms"] = self._ms(t["prefill"], self.marks[-1][1])
        if "replays_start" in t and replays:
            stats["decode_step_ms"] = self._ms(t["replays_start"], self.marks[-1][1]) / replays
        elif steps > 1:
            stats["decode_step_ms"] = stats["decode_ms"] / (steps - 1)
        return stats


def _stop_ids(checkpoint_dir: Path, config_eos: tuple[int, ...]) -> tuple[int, ...]:
    """config.json's EOS ids and generation_config.json's, if that file exists."""
    ids = set(config_eos)
    gen = checkpoint_dir / "generation_config.json"
    if gen.is_file():
        import json

        from quantroll.model.config import JsonFields

        try:
            raw = json.loads(gen.read_text())
        except json.JSONDecodeError as err:
            raise QuantrollError(f"{gen} is not valid JSON ({err}); fix or delete it") from None
        if not isinstance(raw, dict):
            raise QuantrollError(f"{gen}: expected a JSON object, got {type(raw).__name__}")
        ids.update(JsonFields(raw, str(gen)).ints("eos_token_id"))
    return tuple(sorted(ids))


def on_engine_device(method):
    """Run an Engine method with the engine's CUDA device current: Triton kernels launch on
    the current device, not on their tensors' (an engine on cuda:1 in a process whose
    current device is cuda:0 would otherwise launch its kernels on the wrong GPU)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.device.type != "cuda":
            return method(self, *args, **kwargs)
        with torch.cuda.device(self.device):
            return method(self, *args, **kwargs)
    return wrapper


class Engine:
    def __init__(self, checkpoint_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
                 fp8_kernels: bool | None = None, cuda_graphs: bool = True, fused_kernels: bool = True,
                 max_kv_cache_gb: float | None = None):
        """fp8_kernels: real FP8 GEMMs for a block-FP8 checkpoint (default: when the GPU has
        them; False forces exact emulation). cuda_graphs: replay decode steps as CUDA graphs
        on GPU (default on; off is the eager path, for debugging)."""
        self.checkpoint_dir = Path(checkpoint_dir)
        model, fmt = load_model(self.checkpoint_dir, device, dtype)
        self._setup(model, fmt, device, dtype, fp8_kernels, cuda_graphs, _stop_ids(self.checkpoint_dir, model.config.eos_token_ids),
                    fused_kernels)
        self.max_kv_cache_bytes = int(max_kv_cache_gb * 2**30) if max_kv_cache_gb else None

    @classmethod
    def from_model(cls, model, fmt, device, dtype=torch.bfloat16, fp8_kernels: bool | None = None,
                   cuda_graphs: bool = True, stop_ids: tuple[int, ...] = (), fused_kernels: bool = True) -> "Engine":
        """An engine around a model already in memory (benchmarks of real shapes, tests)."""
        engine = cls.__new__(cls)
        engine.checkpoint_dir = None
        engine._setup(model, fmt, device, dtype, fp8_kernels, cuda_graphs, stop_ids, fused_kernels)
        return engine

    def _setup(self, model, fmt, device, dtype, fp8_kernels, cuda_graphs, stop_ids, fused_kernels=True) -> None:
        self.model, self.format = model, fmt
        self.device = torch.device(device)
        self.dtype = dtype
        self.config = self.model.config
        self.last_stats: dict[str, float] = {}
        self.max_kv_cache_bytes: int | None = None
        self.gpu_kernels = self.device.type == "cuda" and triton_available()
        self.use_cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.route_dtype = torch.int16 if self.config.num_experts <= torch.iinfo(torch.int16).max else torch.int32
        self.model.fuse_projections_()
        if self.gpu_kernels and fused_kernels:
            self.model.enable_fused_kernels_()
        if self.format is not None and self.format.name == "fp8" and self.gpu_kernels:
            from quantroll.kernels.fp8_linear import fp8_hardware_available

            if fp8_kernels is None:
                fp8_kernels = fp8_hardware_available(self.device)
            if fp8_kernels:
                for layer in self.model.quantized_linears().values():
                    layer.backend = "fp8"
        self.default_stop_ids = stop_ids
        if self.gpu_kernels:
            from quantroll.model.moe import SparseMoE

            for module in self.model.modules():
                if isinstance(module, SparseMoE):
                    module.stack_experts_()
        self.grouped_moe = all(m.stacks is not None for m in self.model.modules() if hasattr(m, "stacks"))
        self.weight_version = 0
        self._params = dict(self.model.named_parameters())
        self._linears = {m.name: m for m in self.model.modules() if isinstance(m, QLinear) and m.quantized}

    def quantized_layers(self) -> dict:
        """Quantized linears by checkpoint module name (a fused layer's parts, not the fused layer)."""
        return {name: layer for name, layer in self._linears.items() if not name.endswith(("qkv_proj", "gate_up_proj"))}

    def state(self) -> dict[str, torch.Tensor]:
        """Every weight the engine holds, by checkpoint tensor name, as stored (quantized
        weights as data + scale [+ global]), for snapshots and the update check."""
        out = {}
        for name, layer in self.quantized_layers().items():
            q = layer.quantized_weight()
            out[f"{name}.weight"] = q.data
            out[f"{name}.weight_scale"] = q.scale
            if q.global_scale is not None:
                out[f"{name}.weight_global"] = q.global_scale
        for name, p in self._params.items():
            if not name.endswith(("qkv_proj.weight", "gate_up_proj.weight")):
                out[name] = p.data
        return out

    @property
    def precision(self) -> str:
        """What the engine computes in, as reports should print it ("fp8 (emulated)" ...)."""
        if self.format is None:
            return "bfloat16" if self.dtype == torch.bfloat16 else f"bfloat16 ({str(self.dtype).replace('torch.', '')} compute)"
        backends = {layer.backend for layer in self._linears.values()}
        return f"{self.format.name} (emulated)" if "emulated" in backends else self.format.name

    # -- generation -------------------------------------------------------------------
    def _check(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> None:
        check_request(prompts, params, self.config.vocab_size, self.config.max_position_embeddings)

    @torch.no_grad()
    @on_engine_device
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams()) -> list[GenerationResult]:
        """Generate for every prompt. With ``max_kv_cache_bytes`` set, the prompts run in
        consecutive sub-batches whose KV cache fits; prompt i always samples with seed + i."""
        self._check(prompts, params)
        seq_len = max(len(p) for p in prompts) + params.max_new_tokens
        chunk = len(prompts)
        if self.max_kv_cache_bytes:
            per_sequence = kv_cache_bytes(self.config, 1, seq_len, self.dtype)
            if per_sequence > self.max_kv_cache_bytes:
                raise QuantrollError(
                    f"one sequence of {seq_len} tokens needs {per_sequence / 2**30:.3f} GiB of KV cache, more than the "
                    f"{self.max_kv_cache_bytes / 2**30:.3f} GiB allowed; raise the KV-cache bound or lower "
                    "max_new_tokens")
            chunk = max(1, self.max_kv_cache_bytes // per_sequence)
        results: list[GenerationResult] = []
        for start in range(0, len(prompts), chunk):
            results += self._generate_batch(prompts[start: start + chunk], params, start)
        return results

    def _generate_batch(self, prompts, params: SamplingParams, seed_offset: int) -> list[GenerationResult]:
        batch = len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        seq_len = int(lengths.max()) + params.max_new_tokens
        try:
            return self._generate(prompts, params, batch, lengths, seq_len, seed_offset)
        except torch.OutOfMemoryError:
            gib = kv_cache_bytes(self.config, batch, seq_len, self.dtype) / 2**30
            raise QuantrollError(
                f"out of GPU memory generating {batch} sequences of up to {seq_len} tokens "
                f"(KV cache {gib:.2f} GiB); lower the batch size or max_new_tokens") from None

    def _generate(self, prompts, params, batch, lengths, seq_len, seed_offset=0) -> list[GenerationResult]:
        cfg, dev = self.config, self.device
        stop = torch.tensor(params.stop_token_ids if params.stop_token_ids is not None else self.default_stop_ids,
                            dtype=torch.long, device=dev)
        cache = KVCache(cfg, batch, seq_len, self.dtype, dev, decode_kernel=self.gpu_kernels)
        p_max = int(lengths.max())
        ids = torch.zeros(batch, p_max, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, device=dev)
        positions = torch.arange(p_max, device=dev).expand(batch, p_max)
        prefill_routing = RecordRouting() if cfg.moe_layers else None
        cache.positions = positions
        timer = _Timer(dev)
        hidden = self.model.hidden(ids, positions, cache, prefill_routing)
        rows = torch.arange(batch, device=dev)
        seeds = params.seed + seed_offset + rows.to(torch.int64)
        token, logprob = sample(self.model.logits(hidden[rows, lengths - 1]), params, seeds, lengths)
        loop = DecodeLoop(self.model, cache, params, stop, seeds, token, logprob, lengths, self.route_dtype,
                          use_graph=self.use_cuda_graphs and self.grouped_moe)
        timer.mark("prefill")
        steps = loop.run(timer)
        self.last_stats = timer.summary(steps, loop.replays)
        prefill = None
        if prefill_routing is not None:
            k = cfg.num_experts_per_tok
            prefill = torch.stack([prefill_routing.chosen[layer].view(batch, p_max, k) for layer in cfg.moe_layers], dim=2)
        return self._results(prompts, loop.tokens[:steps].t(), loop.logprobs[:steps].t(), stop, prefill,
                             None if loop.routes is None else loop.routes.transpose(0, 1))

    def _results(self, prompts, tokens, logprobs, stop, prefill_routes, decode_routes):
        tokens, logprobs = tokens.cpu(), logprobs.cpu()
        is_stop = torch.isin(tokens, stop.cpu())
        if prefill_routes is not None:
            prefill_routes, decode_routes = prefill_routes.to(self.route_dtype).cpu(), decode_routes.cpu()
        out = []
        for i, prompt in enumerate(prompts):
            hits = is_stop[i].nonzero()
            n = int(hits[0]) + 1 if len(hits) else tokens.shape[1]
            experts = None
            if prefill_routes is not None:
                experts = torch.cat([prefill_routes[i, : len(prompt)], decode_routes[i, : n - 1]], dim=0)
            out.append(GenerationResult(list(prompt), tokens[i, :n].tolist(), logprobs[i, :n].tolist(),
                                        "stop" if len(hits) else "length", experts, self.weight_version))
        return out

    # -- weight updates ---------------------------------------------------------------
    @on_engine_device
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor | QuantizedTensor]]) -> int:
        """Update weights in place, all or nothing (engine/weights.py): a floating tensor for a
        BF16 parameter; for a quantized layer ``name.weight`` either a QuantizedTensor (data +
        scale, loaded as is) or a floating tensor (quantized here by the layer's format). A dict
        of name -> tensor works too. Returns the new version."""
        from quantroll.engine.weights import load_weights

        load_weights(named_tensors, self._linears, self._params, self.device)
        self.weight_version += 1
        return self.weight_version
