"""Quantize one checkpoint weight the way the checkpoint stores it.

For FP8 and MXFP8 this is exactly ``fmt.quantize_weight``. For NVFP4 the siblings of
a fused layer (q/k/v, gate/up) must share one global scale, because vLLM and SGLang
run them as one GEMM with one ``weight_scale_2`` (they take the max over shards, so
different per-shard scales would silently mis-scale the smaller ones). The shared
global is amax over the group / 2688.

The formats compute the global from the tensor itself, so the shared one is imposed
by appending one row that holds the group amax: NVFP4 blocks are 1x16 within a row,
so the extra row changes the global scale and nothing else, and is cut off again.
This is exactly "quantize with global = group amax / 2688" using only the format's
public API; the weight sync must call this same function.
"""

from __future__ import annotations

import torch

from quantroll.formats import Format, QuantizedTensor


def quantize_for_checkpoint(
    fmt: Format, w: torch.Tensor, name: str, shared_amax: torch.Tensor | float | None = None
) -> QuantizedTensor:
    """``fmt.quantize_weight(w, name)``, with NVFP4's global scale taken from ``shared_amax``.

    ``shared_amax`` (NVFP4 only) is max |x| over the tensor's scale group, as float32;
    it must be >= amax(w). None means the tensor's own amax.
    """
    if shared_amax is None or fmt.name != "nvfp4":
        return fmt.quantize_weight(w, name)
    # NaN/Inf are refused by quantize_weight on the full tensor below, before this row matters.
    row = torch.zeros(1, w.shape[1], dtype=torch.float32)
    row[0, 0] = float(shared_amax)
    q = fmt.quantize_weight(torch.cat([w.to(torch.float32), row]), name)
    n = w.shape[0]
    return QuantizedTensor(q.data[:n].clone(), q.scale[:n].clone(), q.format, tuple(w.shape), q.block, q.global_scale)


def tensor_amax(w: torch.Tensor) -> float:
    """max |w| as the float32 value the format will compute it from."""
    return float(w.to(torch.float32).abs().amax())
