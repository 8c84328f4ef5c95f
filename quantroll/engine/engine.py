"""The rollout engine: continuous batching over a paged KV cache, reporting what RL needs.

``Engine(checkpoint_dir)`` loads a BF16 or quantized checkpoint; ``generate`` queues all
its prompts and returns, per prompt, the response tokens, the logprob of each (full
vocabulary, at the sampling temperature, before truncation), the finish reason, and for
MoE models the experts each MoE layer chose at every position the trainer will process
([P + R - 1, moe_layers, top_k]): the prompt's P positions and every response token but
the last. ``load_weights`` updates weights in place for the weight sync.

The parts, as serving engines split them: ``Sequence`` (one request's state),
``BlockManager`` (the KV blocks, shared prompt prefixes), ``Scheduler`` (what runs next:
admission, chunked prefill, decode, preemption), ``ModelRunner`` (all device state:
the pools, the forward passes, the decode graphs). The KV pool is allocated once, at the
first generate() (``CacheConfig``: its budget and dtype), and kept across calls;
``release_kv_cache`` gives its memory back (to a trainer on the same GPU).

What a sample depends on: its prompt, its seed (``params.seed + prompt index``) and the
weights. The noise a position draws is a hash of (seed, position), so neither the
schedule, nor what runs beside it, nor a preemption changes it; only rounding in the
logits can (batch-variant kernels).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Sequence as Seq
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from quantroll.engine.block_manager import BlockManager, blocks_for
from quantroll.engine.model_runner import ModelRunner
from quantroll.engine.plan import (describe_attention, describe_linears, engine_plan, resolve_attention,
                                   runs_gpu_kernels)
from quantroll.engine.paged_cache import CacheConfig, PagedKVCache, kv_bytes_per_token
from quantroll.engine.request import check_request
from quantroll.engine.sampling import SamplingParams
from quantroll.engine.scheduler import Prefill, Scheduler, SchedulerConfig
from quantroll.engine.sequence import Sequence, Status
from quantroll.errors import QuantrollError
from quantroll.formats import QuantizedTensor
from quantroll.kernels import triton_available
from quantroll.model.kernel_config import DEFAULT_KERNELS, KernelConfig
from quantroll.model.linear import QLinear
from quantroll.model.loader import load_model


@dataclass(frozen=True)
class GenerationResult:
    prompt_tokens: list[int]
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token, included in tokens) or "length"
    routed_experts: torch.Tensor | None  # int16/int32 [P + R - 1, moe_layers, top_k], MoE only
    weight_version: int
    preemptions: int = 0  # times this sequence was preempted and recomputed

log = logging.getLogger(__name__)


def _stop_ids(checkpoint_dir: Path, config_eos: tuple[int, ...]) -> tuple[int, ...]:
    """config.json's EOS ids and generation_config.json's, if that file exists."""
    ids = set(config_eos)
    gen = checkpoint_dir / "generation_config.json"
    if gen.is_file():
        import json

        from quantroll.jsonfields import JsonFields

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
                 cache: CacheConfig | None = None, scheduler: SchedulerConfig | None = None,
                 kernels: KernelConfig | None = None):
        """fp8_kernels: real FP8 GEMMs for a block-FP8 checkpoint (default: when the GPU has
        them; False forces exact emulation). cuda_graphs: replay decode steps as CUDA graphs
        on GPU (default on; off is the eager path, for debugging). cache / scheduler: the KV
        pool (budget, block size, dtype) and the batching policy. kernels: the ops' forms
        (model/kernel_config.py); batch-invariant ones (true on-policy) run one launch shape
        per op, none of the fused kernel table, and need a BF16 KV cache."""
        self.checkpoint_dir = Path(checkpoint_dir)
        model, fmt = load_model(self.checkpoint_dir, device, dtype)
        self._setup(model, fmt, device=device, dtype=dtype, fp8_kernels=fp8_kernels, cuda_graphs=cuda_graphs,
                    stop_ids=_stop_ids(self.checkpoint_dir, model.config.eos_token_ids), fused_kernels=fused_kernels,
                    cache=cache, scheduler=scheduler, kernels=kernels)

    @classmethod
    def from_model(cls, model, fmt, device, dtype=torch.bfloat16, fp8_kernels: bool | None = None,
                   cuda_graphs: bool = True, stop_ids: tuple[int, ...] = (), fused_kernels: bool = True,
                   cache: CacheConfig | None = None, scheduler: SchedulerConfig | None = None,
                   kernels: KernelConfig | None = None) -> "Engine":
        """An engine around a model already in memory (benchmarks of real shapes, tests). The
        engine prepares the model from its forward plan: a model serves engines of one plan
        (another plan is refused: build a model per plan)."""
        engine = cls.__new__(cls)
        engine.checkpoint_dir = None
        engine._setup(model, fmt, device=device, dtype=dtype, fp8_kernels=fp8_kernels, cuda_graphs=cuda_graphs,
                      stop_ids=stop_ids, fused_kernels=fused_kernels, cache=cache, scheduler=scheduler, kernels=kernels)
        return engine

    def _setup(self, model, fmt, *, device, dtype, fp8_kernels: bool | None, cuda_graphs: bool,
               stop_ids: tuple[int, ...], fused_kernels: bool, cache: CacheConfig | None,
               scheduler: SchedulerConfig | None, kernels: KernelConfig | None) -> None:
        """Check the options, decide the forward plan (engine/plan.py) and prepare the model
        from it, once. Keyword-only: the options are those of ``__init__``."""
        self.model, self.format = model, fmt
        self.device = torch.device(device)
        self.dtype = dtype
        self.config = self.model.config
        self.last_stats: dict[str, float] = {}
        self.kernels = kernels or DEFAULT_KERNELS
        invariant = self.kernels.batch_invariant
        # batch-invariant kernels (model/invariant.py) replace the GPU kernel table and the fused
        # kernels; decode graphs stay (padding a batch to its bucket adds rows no real row depends on)
        self.gpu_kernels = runs_gpu_kernels(self.device, self.kernels)
        # (without Triton the invariant attention's torch form reads host-side lengths: eager)
        self.use_cuda_graphs = cuda_graphs and self.device.type == "cuda" and (not invariant or triton_available())
        self.cache_config = cache or CacheConfig()
        self.kernels, cuda_refused = resolve_attention(self.kernels, self.config, self.cache_config.kv_cache_dtype,
                                                       self.cache_config.block_size, dtype, self.device)
        if self.gpu_kernels and self.cache_config.kv_cache_dtype == "fp8_e4m3":
            tiles = self.kernels.gpu.attention_tiles(True)
            keys = math.gcd(tiles.decode_block_s, tiles.prefill_block_n)
            if keys % self.cache_config.block_size:
                raise QuantrollError(f"--kv-cache-block-size {self.cache_config.block_size} with --kv-cache-dtype "
                                     f"fp8_e4m3: the FP8 cache's attention reads whole blocks, {keys} keys per tile; "
                                     f"use a block size that divides {keys}")
        if invariant and self.cache_config.kv_cache_dtype != "bf16":
            raise QuantrollError(f"batch-invariant (true on-policy) kernels need a BF16 KV cache: with "
                                 f"{self.cache_config.kv_cache_dtype} the engine attends over quantized keys and "
                                 "values while the trainer attends in its own precision")
        sched = scheduler or SchedulerConfig()
        if sched.decode_steps is None:
            sched = replace(sched, decode_steps=8 if self.device.type == "cuda" else 1)
        self.scheduler_config = sched
        self.route_dtype = torch.int16 if self.config.num_experts <= torch.iinfo(torch.int16).max else torch.int32
        self.plan = engine_plan(self.kernels, self.config, fmt, self.device, fp8_kernels=fp8_kernels,
                                fused_kernels=fused_kernels)
        self.model.prepare_(self.plan)
        (log.warning if cuda_refused else log.info)(
            "attention: %s", describe_attention(self.plan, self.device, self.cache_config.kv_cache_dtype, cuda_refused))
        log.info("linears: %s", describe_linears(self.plan, fmt, self.device, fp8_kernels))
        if self.plan.linear_backend != "emulated":
            self._log_gemm_choices()
        if self.plan.linear_backend == "emulated" and self.model.quantized_linears():
            # exact emulation quantizes activations through the format's own checks, which read
            # their verdict on the host: not capturable, and a reference path, not a speed one
            self.use_cuda_graphs = False
        self.default_stop_ids = stop_ids
        self.grouped_moe = all(m.stacks is not None for m in self.model.modules() if hasattr(m, "stacks"))
        self.weight_version = 0
        self._params = dict(self.model.named_parameters())
        self._linears = {m.name: m for m in self.model.modules() if isinstance(m, QLinear) and m.quantized}
        self._kv: PagedKVCache | None = None
        self._blocks: BlockManager | None = None
        self._runner: ModelRunner | None = None

    def _log_gemm_choices(self) -> None:
        """Log once which FP8 GEMM kernel each linear's products take, by row count (and
        resolve kernels built at first use now, before any decode graph is captured)."""
        from quantroll.kernels.gemm_plan import describe_choices

        shapes = {}
        for layer in self.model.quantized_linears().values():
            shapes.setdefault(layer.name.rsplit(".", 1)[-1], (layer.out_features, layer.in_features))
        for name, line in describe_choices(self.kernels.gpu.fp8_gemms, shapes, self.device).items():
            log.info("FP8 GEMM %s %dx%d: %s", name, *shapes[name], line)

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
            if not name.rsplit(".", 1)[0].endswith(("qkv_proj", "gate_up_proj")):  # fused: views of the parts
                out[name] = p.data
        return out

    def weight_parameters(self) -> dict[str, torch.Tensor]:
        """The engine's BF16 parameters by checkpoint name (a fused layer's parts are views of
        it): what a direct weight update (quantroll/sync/direct.py) writes in place."""
        return dict(self._params)

    @property
    def precision(self) -> str:
        """What the engine computes in, as reports should print it ("fp8 (emulated)" ...)."""
        if self.format is None:
            return "bfloat16" if self.dtype == torch.bfloat16 else f"bfloat16 ({str(self.dtype).replace('torch.', '')} compute)"
        emulated = self._linears and self.plan.linear_backend == "emulated"
        return f"{self.format.name} (emulated)" if emulated else self.format.name

    @property
    def fused_projections(self) -> bool:
        """Whether q/k/v and gate/up run as one GEMM each (the plan's choice)."""
        return self.plan.fuse_projections

    @property
    def kv_cache_dtype(self) -> str:
        return self.cache_config.kv_cache_dtype

    @property
    def kv_cache_label(self) -> str:
        """The KV cache's precision as reports print it; the CPU's FP8 KV is an emulation."""
        if self.kv_cache_dtype == "bf16":
            return "bf16"
        return "fp8_e4m3" if self.gpu_kernels else "fp8_e4m3 (emulated)"

    # -- the KV cache -------------------------------------------------------------------
    def kv_bytes_per_token(self) -> float:
        return kv_bytes_per_token(self.config, self.kv_cache_dtype, self.dtype)

    def _budget_bytes(self) -> int:
        cfg = self.cache_config
        if cfg.memory_gb is not None:
            return int(cfg.memory_gb * 2**30)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            return int(torch.cuda.mem_get_info(self.device)[0] * cfg.memory_fraction)
        return int(cfg.cpu_memory_gb * 2**30)

    def _block_bytes(self) -> float:
        routes = len(self.config.moe_layers) * self.config.num_experts_per_tok * torch.iinfo(self.route_dtype).bits // 8
        return (self.kv_bytes_per_token() + routes) * self.cache_config.block_size

    def kv_cache_capacity_tokens(self) -> int:
        """Tokens the pool holds (allocated now, or as it would be allocated now)."""
        if self._blocks is not None:
            return self._blocks.usable_blocks * self._blocks.block_size
        return max(int(self._budget_bytes() // self._block_bytes()) - 1, 0) * self.cache_config.block_size

    def _ensure_cache(self) -> None:
        if self._kv is not None:
            return
        bs = self.cache_config.block_size
        budget = self._budget_bytes()
        num_blocks = int(budget // self._block_bytes())
        if num_blocks < 2:
            raise QuantrollError(
                f"a KV cache budget of {budget / 2**30:.4f} GiB holds {num_blocks} block(s) of {bs} tokens "
                f"({self._block_bytes() / 2**20:.3f} MiB each), fewer than 2; raise --kv-cache-memory-gb")
        try:
            self._kv = PagedKVCache(self.config, num_blocks, bs, self.dtype, self.kv_cache_dtype, self.device,
                                    self.gpu_kernels, self.kernels)
        except torch.OutOfMemoryError:
            raise QuantrollError(f"out of GPU memory allocating a KV cache of {budget / 2**30:.2f} GiB; lower "
                                 "--kv-cache-memory-gb (or the memory fraction)") from None
        self._blocks = BlockManager(num_blocks, bs, self.cache_config.prefix_sharing)
        max_len = min(self.config.max_position_embeddings, self._blocks.usable_blocks * bs)
        self._runner = ModelRunner(self.model, self._kv, self.device, self.route_dtype,
                                   self.use_cuda_graphs and self.grouped_moe, blocks_for(max_len, bs),
                                   self.scheduler_config.decode_steps, self.kernels)

    def release_kv_cache(self) -> None:
        """Free the KV pool and the decode graphs (which point into it); the next generate()
        allocates them again. A trainer sharing the GPU calls this before its step."""
        self._kv = self._blocks = self._runner = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.no_grad()
    @on_engine_device
    def capture_decode_graphs(self, params: SamplingParams = SamplingParams()) -> int:
        """Capture the decode graph of every batch bucket for these sampling settings now,
        rather than at each bucket's first use inside a generate() call (benchmarks, the
        first RL step). Returns how many graphs the engine holds."""
        self._ensure_cache()
        self._runner.capture_all(params, self.scheduler_config.max_num_seqs)
        return len(self._runner.states)

    # -- generation -------------------------------------------------------------------
    @torch.no_grad()
    @on_engine_device
    def generate(self, prompts: Seq[Seq[int]], params: SamplingParams = SamplingParams(),
                 max_new_tokens: Seq[int] | None = None) -> list[GenerationResult]:
        """Generate for every prompt (prompt i samples with seed ``params.seed + i``).
        ``max_new_tokens``: an optional cap per prompt, each at most ``params.max_new_tokens``."""
        check_request(prompts, params, self.config.vocab_size, self.config.max_position_embeddings)
        caps = _per_prompt_caps(max_new_tokens, len(prompts), params.max_new_tokens)
        self._ensure_cache()
        self._blocks.reset_prefix_cache()  # share within a call only: a call's bits depend on it alone
        seqs = [Sequence(i, list(p), caps[i], params.seed + i) for i, p in enumerate(prompts)]
        sched = Scheduler(self._blocks, self.scheduler_config, params.max_new_tokens)
        sched.on_preempt = self._runner.save_routes
        for seq in seqs:
            sched.add(seq)
        stop = frozenset(params.stop_token_ids if params.stop_token_ids is not None else self.default_stop_ids)
        results: dict[int, GenerationResult] = {}
        steps = 0
        try:
            while not sched.done:
                work = sched.schedule()
                if work is None:
                    raise RuntimeError("the scheduler has waiting sequences but scheduled nothing")
                if isinstance(work, Prefill):
                    sampled = self._runner.prefill(work.chunks, params)
                    sched.prefilled(work.chunks)
                    for chunk, first in zip(work.chunks, sampled):
                        if first is not None and chunk.seq.append(*first, stop):
                            results[chunk.seq.index] = self._finish(chunk.seq, sched)
                    continue
                tokens, logprobs = self._runner.decode(work.seqs, work.steps, params, self.scheduler_config.max_num_seqs)
                steps += work.steps
                for seq, row, lps in zip(work.seqs, tokens, logprobs):
                    if seq.status is not Status.RUNNING:
                        continue  # static policy: a finished row still computed until its group ends
                    if seq.extend(row, lps, stop):
                        results[seq.index] = self._finish(seq, sched)
                    else:
                        sched.decoded(seq, work.steps)
        except torch.OutOfMemoryError:
            raise QuantrollError(
                f"out of GPU memory generating {len(prompts)} sequences beside a KV cache of "
                f"{self._kv.nbytes / 2**30:.2f} GiB; lower --kv-cache-memory-gb (or the memory fraction) or "
                "max_num_batched_tokens") from None
        self._record_stats(sched, steps)
        return [results[i] for i in range(len(prompts))]

    def _finish(self, seq: Sequence, sched: Scheduler) -> GenerationResult:
        routes = self._runner.routes_of(seq)
        sched.finish(seq)
        return GenerationResult(seq.prompt, seq.tokens, seq.logprobs, seq.finish_reason, routes, self.weight_version,
                                seq.preemptions)

    def _record_stats(self, sched: Scheduler, steps: int) -> None:
        stats = self._runner.take_timings()
        stats.update({
            "decode_steps": steps, "preemptions": sched.preemptions, "prefill_tokens": sched.prefill_tokens,
            "prefill_tokens_saved": sched.prefill_tokens_saved, "peak_blocks_used": self._blocks.peak_used,
            "num_blocks": self._blocks.usable_blocks, "block_size": self._blocks.block_size,
            "kv_cache_gb": self._kv.nbytes / 2**30, "graph_captures": self._runner.captures,
            "kernels": {"batch_invariant": True} if self.kernels.batch_invariant
            else {"gpu": self.gpu_kernels, **(self.kernels.gpu.describe() if self.gpu_kernels else {})},
        })
        if steps:
            stats["decode_step_ms"] = stats["decode_ms"] / steps
        stats["decode_trace"] = self._runner.trace
        self._runner.trace = []
        self._blocks.peak_used = self._blocks.num_used
        self.last_stats = stats

    # -- weight updates ---------------------------------------------------------------
    @on_engine_device
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor | QuantizedTensor]],
                     commit: bool = True) -> int:
        """Update weights in place, all or nothing (engine/weights.py): a floating tensor for a
        BF16 parameter; for a quantized layer ``name.weight`` either a QuantizedTensor (data +
        scale, loaded as is) or a floating tensor (quantized here by the layer's format). A dict
        of name -> tensor works too. Returns the new version. ``commit=False``: one part of an
        update that arrives in pieces (the weight broadcast's buckets); the version moves once,
        at the call with ``commit=True`` that ends it (which may carry no tensors)."""
        from quantroll.engine.weights import load_weights

        load_weights(named_tensors, self._linears, self._params, self.device)
        if commit:
            self.weight_version += 1
        return self.weight_version


def _per_prompt_caps(caps: Seq[int] | None, n: int, limit: int) -> list[int]:
    if caps is None:
        return [limit] * n
    caps = list(caps)
    if len(caps) != n:
        raise QuantrollError(f"max_new_tokens has {len(caps)} entries for {n} prompts; give one per prompt")
    for i, c in enumerate(caps):
        if not isinstance(c, int) or isinstance(c, bool) or not 1 <= c <= limit:
            raise QuantrollError(f"max_new_tokens[{i}] must be an integer in [1, {limit}] (params.max_new_tokens), "
                                 f"got {c!r}")
    return caps
