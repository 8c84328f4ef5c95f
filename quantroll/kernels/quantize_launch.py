"""The GPU quantize kernels each format registers (kernels depend on formats, never the reverse).

A format with a GPU quantize path registers a ``GpuQuantizer`` under its registry name:
how to queue its kernels for a list of weights, and the flag value that marks a NaN/Inf
weight. ``kernels/quantize.py`` looks the format up here instead of testing its name; a
format without an entry has no GPU path (the weight sync then quantizes on the reference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from quantroll.formats import Format, QuantizedTensor

_INF_BITS = 0x7F800000

Launch = Callable[[Format, Sequence[torch.Tensor], Sequence[QuantizedTensor], torch.Tensor, bool, dict], None]


@dataclass(frozen=True)
class GpuQuantizer:
    """launch(fmt, xs, records, flags, overlap, cfg): queue every kernel (xs contiguous).
    bad_flag: flags[i] >= bad_flag marks weight i as holding NaN/Inf.
    direct:   the kernels can write straight into the engine's buffers under one CUDA
              graph (the direct one-GPU weight update, sync/direct.py)."""

    launch: Launch
    bad_flag: int = 1
    direct: bool = False


GPU_QUANTIZERS: dict[str, GpuQuantizer] = {}


def gpu_quantizer(fmt: Format) -> GpuQuantizer | None:
    return GPU_QUANTIZERS.get(fmt.name)


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device=device)
    return _SIDE_STREAMS[device]


def _launch_fp8(fmt, xs, records, flags, overlap, cfg) -> None:
    from quantroll.kernels import quantize_triton as qt

    for i, (x, q) in enumerate(zip(xs, records)):
        qt.launch_fp8(x, q.data, q.scale, flags, i, **cfg)


def _launch_mxfp8(fmt, xs, records, flags, overlap, cfg) -> None:
    from quantroll.kernels import quantize_triton as qt

    for i, (x, q) in enumerate(zip(xs, records)):
        qt.launch_mxfp8(x, q.data, q.scale, flags, i, ceil=(fmt.scale_rule == "ceil"), **cfg)


def _launch_nvfp4(fmt, xs, records, flags, overlap, cfg) -> None:
    """NVFP4 needs each weight's amax (pass 1) before its groups (pass 2); pass 2 is
    arithmetic-heavy and pass 1 is a pure read, so with ``overlap`` (CUDA only) every
    pass 1 runs on a side stream and each pass 2 waits only for its own weight's amax:
    pass 1 of the next weights streams while pass 2 computes."""
    from quantroll.kernels import quantize_triton as qt

    amax_cfg = cfg.get("absmax", {})
    cfg = {k: v for k, v in cfg.items() if k != "absmax"}
    if overlap and xs and xs[0].device.type == "cuda":
        main = torch.cuda.current_stream(xs[0].device)
        side = _side_stream(xs[0].device)
        side.wait_stream(main)
        done = []
        with torch.cuda.stream(side):
            for i, x in enumerate(xs):
                qt.launch_absmax(x, flags, i, **amax_cfg)
                done.append(torch.cuda.Event())
                done[-1].record(side)
        for i, (x, q) in enumerate(zip(xs, records)):
            main.wait_event(done[i])
            qt.launch_nvfp4(x, q.data, q.scale, q.global_scale, flags, i, **cfg)
        main.wait_stream(side)
    else:  # pass 1 then pass 2 weight by weight: a weight that fits in L2 is read from L2 the second time
        for i, (x, q) in enumerate(zip(xs, records)):
            qt.launch_absmax(x, flags, i, **amax_cfg)
            qt.launch_nvfp4(x, q.data, q.scale, q.global_scale, flags, i, **cfg)


GPU_QUANTIZERS.update({
    "fp8": GpuQuantizer(_launch_fp8, direct=True),
    "mxfp8": GpuQuantizer(_launch_mxfp8, direct=True),
    "nvfp4": GpuQuantizer(_launch_nvfp4, bad_flag=_INF_BITS),  # pass 1 writes the amax bits: Inf and above is bad
})
