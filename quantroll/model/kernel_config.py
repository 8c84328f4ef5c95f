"""Which implementation each op of a forward pass takes, as one frozen value, and the
frozen forward plan that contains it.

The engine and the trainer each hold a ``KernelConfig``, given to the model once inside
its ``ForwardPlan`` (``CausalLM.prepare_``): the default keeps every op as it is (the fastest
kernel for each shape), ``INVARIANT_KERNELS`` makes every op batch-invariant
(model/invariant.py) so that a token's logprob is the same bits whatever else shares its
batch, whatever the schedule, and whether it is computed by the engine's decode step, its
chunked prefill or the trainer's full causal forward (``--true-on-policy-mode``). A value
rather than a module flag, so that an engine and a trainer in one process can differ and
nothing is switched behind a caller's back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantroll.errors import QuantrollError
from quantroll.formats import Format
from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS, EngineKernels
from quantroll.kernels.invariant_gemm import InvariantGemmTiles
from quantroll.kernels.paged_attention import PagedTiles


@dataclass(frozen=True)
class KernelConfig:
    """batch_invariant: every op in its invariant form (one GEMM shape, fixed reduction
    orders; model/invariant.py). gemm_rows: rows of that one GEMM shape (every product is
    cut into tiles of exactly this many rows, the last one zero-padded). attention_elements:
    the most float32 elements one chunk of the invariant attention materializes (queries are
    independent, so the chunking never changes a value, only the memory it takes).
    invariant_attention: on a GPU with Triton, the one tile shape of the prefill kernel that
    every batch-invariant attention runs, the engine's and the trainer's
    (kernels/paged_attention.invariant_attention; 16 query rows: the fewest an MMA takes, so
    that a decode step wastes least). invariant_gemm: on a GPU with Triton, the one tile of
    every batch-invariant GEMM (kernels/invariant_gemm.py; gemm_rows is the CPU's). gpu: the
    GPU kernels' choices (kernels/choices.py), used where batch_invariant is False."""

    batch_invariant: bool = False
    gemm_rows: int = 32  # CPU default study: 32 rows beat 16 by ~15% (rollout), 64 pads small batches more
    attention_elements: int = 1 << 24
    invariant_attention: PagedTiles = PagedTiles(prefill_block_m=16, prefill_block_n=64, prefill_warps=4)
    invariant_gemm: InvariantGemmTiles = InvariantGemmTiles()
    gpu: EngineKernels = field(default=DEFAULT_ENGINE_KERNELS)

    def __post_init__(self):
        for name in ("gemm_rows", "attention_elements"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise QuantrollError(f"KernelConfig.{name} must be an integer >= 1, got {value!r}")


DEFAULT_KERNELS = KernelConfig()
INVARIANT_KERNELS = KernelConfig(batch_invariant=True)


@dataclass(frozen=True)
class TrainFormat:
    """The trainer's unified low precision (modes 2-4): its BF16 ``layers`` (checkpoint
    names: the ones the engine holds quantized, so first/last BF16 layers match on both
    sides) compute their forward in ``format`` (model/quantized_forward.py); ``real_fp8``:
    on the GPU's FP8 GEMMs rather than the exact emulation."""

    format: Format
    layers: frozenset
    real_fp8: bool = False

    def __post_init__(self):
        if not isinstance(self.layers, frozenset):
            raise QuantrollError(f"TrainFormat.layers must be a frozenset of layer names, got "
                                 f"{type(self.layers).__name__}")


@dataclass(frozen=True)
class ForwardPlan:
    """Everything a forward pass of one model depends on besides its weights, chosen once
    where the engine (engine/plan.py) or the trainer (trainer/policy.load_policy) is built
    and handed to the model once (``CausalLM.prepare_``): every module reads it
    (``self.plan``), none carries a switch of its own, so an engine and a trainer (or two
    engines) in one process never change each other's forward.

    It contains the ``KernelConfig`` rather than growing it: a ``KernelConfig`` is what a
    caller chooses (and what the KV cache, the sampler and the invariance probe read); the
    fields here are what the build decides from the device and the checkpoint (a backend
    the device runs, kernels only a GPU has), so no caller can ask for one the device lacks.

    linear_backend: the quantized linears' backend (kernels/backends.BACKENDS: "emulated",
    or the format's real GEMMs). fused_ops: the fused GPU kernels for norms, residual adds
    and silu*up. fuse_projections: q/k/v and gate/up as one GEMM each (the parts become
    views). stack_experts: MoE experts stacked for the grouped GPU kernel. train: the
    trainer's unified low precision (None: plain BF16 forward)."""

    kernels: KernelConfig = DEFAULT_KERNELS
    linear_backend: str = "emulated"
    fused_ops: bool = False
    fuse_projections: bool = False
    stack_experts: bool = False
    train: TrainFormat | None = None

    def __post_init__(self):
        if not isinstance(self.kernels, KernelConfig):
            raise QuantrollError(f"ForwardPlan.kernels must be a KernelConfig, got {type(self.kernels).__name__}")
        if self.kernels.batch_invariant and (self.fused_ops or self.stack_experts):
            raise QuantrollError("ForwardPlan: batch-invariant kernels replace the fused GPU kernels and the grouped "
                                 "experts; leave fused_ops and stack_experts off")

    def train_format_of(self, name: str):
        """The format layer ``name``'s trainer forward computes in (None: plain BF16)."""
        return self.train.format if self.train is not None and name in self.train.layers else None


DEFAULT_PLAN = ForwardPlan()
