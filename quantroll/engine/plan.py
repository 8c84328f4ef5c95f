"""The engine's forward plan (model/kernel_config.ForwardPlan), decided once when the engine
is built: from the kernels the caller chose, the device, the checkpoint's format and the
engine's options (real FP8 GEMMs, fused kernels). ``Engine`` hands it to its model once
(``CausalLM.prepare_``); nothing changes the model's forward after that.
"""

from __future__ import annotations

import dataclasses

import torch

from quantroll.kernels import triton_available
from quantroll.kernels.backends import hardware_backend
from quantroll.model.config import ModelConfig
from quantroll.model.kernel_config import ForwardPlan, KernelConfig


def runs_gpu_kernels(device: torch.device, kernels: KernelConfig) -> bool:
    """Whether the GPU kernel table (kernels/choices.py) and the fused kernels serve this
    engine: a CUDA device with Triton, unless batch-invariant kernels replace them."""
    return device.type == "cuda" and triton_available() and not kernels.batch_invariant


def invariant_fusion(kernels: KernelConfig, config: ModelConfig, fmt, device: torch.device) -> bool:
    """Whether batch-invariant kernels may fuse q/k/v and gate/up (the trainer keeps them
    apart): only where the fused GEMM gives each column its part's bits, i.e. the one
    Triton tile on a GPU with BF16 weights and every part a whole number of the tile's
    columns, so that a column sits at the same place in its tile either way (probed at
    startup: model/invariance_probe). On the CPU, MKL's blocking follows the GEMM's shape."""
    if not (device.type == "cuda" and triton_available() and fmt is None):
        return False
    block = kernels.invariant_gemm.block_n
    widths = (config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim,
              config.intermediate_size)
    return all(w % block == 0 for w in widths)


def linear_backend(fmt, device: torch.device, gpu_kernels: bool, fp8_kernels: bool | None) -> str:
    """The quantized linears' backend: the format's real GEMMs where the GPU kernels serve
    and ``fp8_kernels`` asks for them (None: when the device has them), else the exact
    emulation (also for formats no hardware GEMM serves)."""
    if fmt is None or not gpu_kernels:
        return "emulated"
    import quantroll.kernels.fp8_linear  # noqa: F401  registers block FP8's real GEMMs

    hardware = hardware_backend(fmt)
    if hardware is None:
        return "emulated"
    if fp8_kernels is None:
        fp8_kernels = hardware.available(device)
    return hardware.backend if fp8_kernels else "emulated"


def engine_plan(kernels: KernelConfig, config: ModelConfig, fmt, device: torch.device, *,
                fp8_kernels: bool | None, fused_kernels: bool) -> ForwardPlan:
    """The plan of an engine on ``device`` serving a checkpoint in ``fmt`` (None: BF16)."""
    gpu = runs_gpu_kernels(device, kernels)
    return ForwardPlan(
        kernels=kernels,
        linear_backend=linear_backend(fmt, device, gpu, fp8_kernels),
        fused_ops=gpu and fused_kernels,
        fuse_projections=not kernels.batch_invariant or invariant_fusion(kernels, config, fmt, device),
        stack_experts=gpu)


def resolve_attention(kernels: KernelConfig, config: ModelConfig, kv_cache_dtype: str, block_size: int,
                      dtype: torch.dtype, device: torch.device) -> tuple[KernelConfig, str | None]:
    """The kernels an engine runs over its cache, and why they differ from those asked for
    (None: they do not). Where the chosen FP8-cache decode is the CUDA kernel and it cannot
    serve this model, cache or device (head size, block size, group, dtype, no nvcc, a failed
    build), the FP8 cache's decode takes the Triton tiles: decided here once, logged with
    the reason, and recorded in the engine's stats, never switched while the engine runs."""
    device = torch.device(device)
    if (kv_cache_dtype != "fp8_e4m3" or not runs_gpu_kernels(device, kernels)
            or kernels.gpu.attention_fp8.decode_kernel != "cuda"):
        return kernels, None
    from quantroll.kernels import paged_decode_cuda

    reason = paged_decode_cuda.unsupported_reason(
        kv_cache_dtype=kv_cache_dtype, head_dim=config.head_dim, block_size=block_size,
        heads=config.num_attention_heads, kv_heads=config.num_key_value_heads, dtype=dtype, device=device)
    reason = reason or paged_decode_cuda.build_reason(device)
    if reason is None:
        return kernels, None
    return dataclasses.replace(kernels, gpu=kernels.gpu.without_cuda_attention()), reason


def _no_gpu_kernels_reason(device: torch.device) -> str:
    return "no CUDA device" if device.type != "cuda" else "Triton is not installed"


def describe_attention(plan: ForwardPlan, device: torch.device, kv_cache_dtype: str,
                       cuda_refused: str | None = None) -> str:
    """Which attention an engine runs over its KV cache, and why (logged once at build);
    ``cuda_refused``: why the CUDA FP8-cache decode kernel does not serve (resolve_attention)."""
    kernels, device = plan.kernels, torch.device(device)
    if kernels.batch_invariant:
        if device.type == "cuda" and triton_available():
            t = kernels.invariant_attention
            return (f"batch-invariant Triton attention, one tile of {t.prefill_block_m} queries x {t.prefill_block_n} "
                    "keys for every step and the trainer (true on-policy)")
        return (f"batch-invariant torch attention in fixed chunks (true on-policy; "
                f"{_no_gpu_kernels_reason(device)})")
    if runs_gpu_kernels(device, kernels):
        from quantroll.kernels import paged_decode_cuda
        from quantroll.kernels.paged_attention import PROGRAMS_PER_SM

        t = kernels.gpu.attention_tiles(kv_cache_dtype != "bf16")
        if t.decode_kernel == "cuda":
            warps = "2 or 4 warps by its waves" if t.decode_warps is None else f"{t.decode_warps} warps"
            decode = (f"decode on the CUDA FP8-cache kernel (kernels/paged_decode_cuda.py), {warps}, sequences split "
                      f"until ~{paged_decode_cuda.PROGRAMS_PER_SM} programs per SM")
        else:
            decode = (f"Triton decode tiles of {t.decode_block_s} keys, {t.decode_stages} stages, {t.decode_warps} "
                      f"warps, sequences split until ~{PROGRAMS_PER_SM} programs per SM")
            if cuda_refused:
                decode += f" (the CUDA FP8-cache kernel cannot serve: {cuda_refused})"
        return (f"paged attention over the {kv_cache_dtype} cache: {decode}; Triton prefill tiles {t.prefill_block_m} "
                f"x {t.prefill_block_n} (the measured table: kernels/choices.py)")
    return f"torch reference attention over the {kv_cache_dtype} cache ({_no_gpu_kernels_reason(device)})"


def describe_linears(plan: ForwardPlan, fmt, device: torch.device, fp8_kernels: bool | None) -> str:
    """Which path an engine's quantized linears take, and why (the GEMM table's per-shape
    choices are logged beside it when real FP8 GEMMs run)."""
    device = torch.device(device)
    if fmt is None:
        return "BF16 checkpoint: torch GEMMs"
    if plan.linear_backend != "emulated":
        return f"{fmt.name}: real GEMMs ({plan.linear_backend}), by the measured table below"
    if not runs_gpu_kernels(device, plan.kernels):
        why = ("batch-invariant kernels (true on-policy)" if plan.kernels.batch_invariant
               else _no_gpu_kernels_reason(device))
    elif hardware_backend(fmt) is None:
        why = f"no hardware GEMM serves {fmt.name} here"
    elif fp8_kernels is False:
        why = "real FP8 GEMMs switched off by the caller"
    else:
        why = "this GPU has no FP8 GEMM"
    return f"{fmt.name}: exact emulation ({why}); numbers labelled emulated"
