"""Quantize one checkpoint weight the way the checkpoint stores it.

For FP8 and MXFP8 this is exactly ``fmt.quantize_weight``. For NVFP4 the siblings of
a fused layer (q/k/v, gate/up) must share one global scale, because vLLM and SGLang
run them as one GEMM with one ``weight_scale_2`` (they take the max over shards, so
different per-shard scales would silently mis-scale the smaller ones). The shared
global is amax over the group / 2688. The weight sync calls this same function.
"""

from __future__ import annotations

import torch

from quantroll.formats import Format, QuantizedTensor


def quantize_for_checkpoint(
    fmt: Format, w: torch.Tensor, name: str, shared_amax: torch.Tensor | float | None = None
) -> QuantizedTensor:
    """``fmt.quantize_weight(w, name)``, with the global scale of a format whose fused
    siblings share one (``fmt.shared_global_scale``: NVFP4) taken from ``shared_amax``.

    ``shared_amax`` (those formats only) is max |x| over the tensor's scale group, as float32;
    it must be >= amax(w). None means the tensor's own amax.
    """
    if shared_amax is None or not fmt.shared_global_scale:
        return fmt.quantize_weight(w, name)
    return fmt.quantize_weight(w, name, global_amax=shared_amax)


def tensor_amax(w: torch.Tensor) -> float:
    """max |w| as the float32 value the format will compute it from."""
    return float(w.to(torch.float32).abs().amax())
