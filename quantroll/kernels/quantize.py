"""GPU weight quantization: the path every RL weight update takes.

``quantize_weight_gpu(w, fmt)`` returns exactly what ``fmt.quantize_weight(w)`` returns
on the CPU (codes, scales, global scale, shapes, dtypes, block), bit for bit, for
block FP8, MXFP8 (both scale rules) and NVFP4; the kernels are in quantize_triton.py.

The weight sync calls it many times per update, so three shapes of call:
- ``quantize_weight_gpu(w, fmt, name, out=q)``: one weight; ``out`` (from
  ``allocate_quantized`` or the engine's own buffers) is written in place.
- ``quantize_weights_gpu(ws, fmt, names, outs=...)``: a list, all launches queued
  back to back and one device-to-host sync at the end for the NaN/Inf check.
- ``QuantizePlan(ws, fmt, names, outs=...).run()``: the same list captured once as a
  CUDA graph and replayed each update (the weights and buffers must keep their
  addresses, as parameters updated in place do). Replay costs one graph launch
  instead of one Python launch per kernel.

NaN/Inf: every kernel computes its blocks' amax from the float bits, where NaN and
Inf sort above every finite value, so each program flags a non-finite block at no
extra pass over memory; the flags (one int32 per weight) are read once after all
launches, and a hit re-runs the reference's input check on that one weight, so the
NonFiniteError names the tensor and the first bad index exactly as the reference
would. The output buffers then hold garbage: the caller must stop, not serve them.

triton is imported only when a kernel is launched, so this module (and the package)
imports on machines without triton. Under ``TRITON_INTERPRET=1`` the same kernels run
on CPU tensors (indexing and control flow only: the interpreter's float->e4m3 cast is
not exact).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.formats import Format, QuantizedTensor, get_format
from quantroll.formats.base import check_input
from quantroll.kernels.launch import interpreting
from quantroll.kernels.quantize_launch import gpu_quantizer

GPU_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def triton_available() -> bool:
    """True when triton imports (it is not a dependency of quantroll)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _resolve(fmt: Format | str) -> Format:
    fmt = get_format(fmt) if isinstance(fmt, str) else fmt
    if gpu_quantizer(fmt) is None:
        raise QuantrollError(f"no GPU quantize path for format '{fmt.name}'")
    return fmt


def output_layout(shape: tuple[int, int], fmt: Format | str) -> dict:
    """Shapes and dtypes of (data, scale, global_scale) for a weight of ``shape``.

    The format's stored tensors (``Format.stored``); global_scale is None for formats
    without one (fp8, mxfp8).
    """
    fmt = _resolve(fmt)
    lay = {"global_scale": None}
    for t in fmt.stored_tensors(tuple(shape)):
        if t.role in ("data", "scale", "global_scale"):
            lay[t.role] = (t.shape, t.dtype)
    return {"data": lay["data"], "scale": lay["scale"], "global_scale": lay["global_scale"]}


def allocate_quantized(shape: tuple[int, int], fmt: Format | str, device: torch.device | str = "cuda") -> QuantizedTensor:
    """Uninitialised output buffers for a weight of ``shape`` (for ``out=``)."""
    fmt = _resolve(fmt)
    lay = output_layout(tuple(shape), fmt)
    data = torch.empty(lay["data"][0], dtype=lay["data"][1], device=device)
    scale = torch.empty(lay["scale"][0], dtype=lay["scale"][1], device=device)
    gs = None if lay["global_scale"] is None else torch.empty((), dtype=torch.float32, device=device)
    return QuantizedTensor(data, scale, fmt.name, tuple(shape), fmt.weight_block, gs)


def _check_weight(w: torch.Tensor, name: str) -> None:
    if not isinstance(w, torch.Tensor):
        raise QuantrollError(f"tensor '{name}' is a {type(w).__name__}, not a torch.Tensor")
    if w.dtype not in GPU_INPUT_DTYPES:
        raise QuantrollError(f"tensor '{name}' has dtype {w.dtype}; the GPU quantize path takes bfloat16, float16 or float32")
    if w.dim() != 2:
        raise QuantrollError(f"tensor '{name}' has shape {tuple(w.shape)}; a weight to quantize must be 2-D [out, in]")
    if w.numel() == 0:
        raise QuantrollError(f"tensor '{name}' has shape {tuple(w.shape)} with no elements; nothing to quantize")
    if w.device.type != "cuda" and not interpreting():
        raise QuantrollError(f"tensor '{name}' is on {w.device}; the GPU quantize path needs a CUDA tensor "
                             "(use fmt.quantize_weight on the CPU)")


def _check_buffer(t: torch.Tensor | None, what: str, shape: tuple, dtype: torch.dtype, w: torch.Tensor, name: str) -> None:
    if t is None:
        raise QuantrollError(f"out= for '{name}' lacks its {what} buffer")
    if tuple(t.shape) != tuple(shape) and not (what == "global_scale" and t.numel() == 1):
        raise QuantrollError(f"out= {what} for '{name}' has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.dtype != dtype:
        raise QuantrollError(f"out= {what} for '{name}' has dtype {t.dtype}, expected {dtype}")
    if t.device != w.device:
        raise QuantrollError(f"out= {what} for '{name}' is on {t.device}, the weight on {w.device}")
    if not t.is_contiguous():
        raise QuantrollError(f"out= {what} for '{name}' is not contiguous; the kernels write it in place")


def _check_out(out: QuantizedTensor, w: torch.Tensor, fmt: Format, name: str) -> QuantizedTensor:
    lay = output_layout(tuple(w.shape), fmt)
    _check_buffer(out.data, "data", *lay["data"], w, name)
    _check_buffer(out.scale, "scale", *lay["scale"], w, name)
    if lay["global_scale"] is not None:
        _check_buffer(out.global_scale, "global_scale", *lay["global_scale"], w, name)
    gs = out.global_scale if lay["global_scale"] is not None else None
    return QuantizedTensor(out.data, out.scale, fmt.name, tuple(w.shape), fmt.weight_block, gs)


def _prepare(weights: Sequence[torch.Tensor], fmt: Format | str, names: Sequence[str] | None,
             outs: Sequence[QuantizedTensor] | None) -> tuple[Format, list[str], list[QuantizedTensor]]:
    fmt = _resolve(fmt)
    weights = list(weights)
    names = [f"weight[{i}]" for i in range(len(weights))] if names is None else list(names)
    if len(names) != len(weights):
        raise QuantrollError(f"{len(weights)} weights but {len(names)} names")
    if outs is not None and len(outs) != len(weights):
        raise QuantrollError(f"{len(weights)} weights but {len(outs)} out= buffers")
    if not weights:
        return fmt, names, []
    device = weights[0].device
    for w, name in zip(weights, names):
        _check_weight(w, name)
        if w.device != device:
            raise QuantrollError(f"tensor '{name}' is on {w.device}, the first weight on {device}; quantize one device at a time")
    if outs is None:
        records = [allocate_quantized(tuple(w.shape), fmt, w.device) for w in weights]
    else:
        records = [_check_out(o, w, fmt, n) for o, w, n in zip(outs, weights, names)]
    return fmt, names, records


def _launch_all(fmt: Format, weights: Sequence[torch.Tensor], records: Sequence[QuantizedTensor],
                flags: torch.Tensor, overlap: bool = True, **cfg) -> None:
    """Queue every kernel the format registered (kernels/quantize_launch.py); flags must
    be zero on entry and mark a bad weight as ``bad_weights`` reads them."""
    xs = [w if w.is_contiguous() else w.contiguous() for w in weights]
    gpu_quantizer(fmt).launch(fmt, xs, records, flags, overlap, cfg)


def bad_weights(fmt: Format | str, flags: torch.Tensor) -> torch.Tensor:
    """Bool mask of the weights whose flags say NaN/Inf (on the flags' device)."""
    fmt = _resolve(fmt)
    return flags >= gpu_quantizer(fmt).bad_flag


def raise_if_nonfinite(fmt: Format | str, flags: torch.Tensor, weights: Sequence[torch.Tensor],
                       names: Sequence[str]) -> None:
    """One device-to-host sync; raise NonFiniteError naming the first bad weight."""
    bad = bad_weights(fmt, flags)
    if not bool(bad.any()):
        return
    i = int(bad.nonzero()[0, 0])
    check_input(weights[i], names[i], weight=True)  # raises the reference's own message
    raise NonFiniteError(f"tensor '{names[i]}' holds NaN/Inf value(s); fix the weights before quantizing")


def quantize_weights_gpu(weights: Sequence[torch.Tensor], fmt: Format | str, names: Sequence[str] | None = None, *,
                         outs: Sequence[QuantizedTensor] | None = None, check_finite: bool = True,
                         **cfg) -> list[QuantizedTensor]:
    """Quantize many 2-D weights: all kernels queued at once, one sync for the NaN/Inf check.

    ``outs``, if given, are written in place (shapes and dtypes as ``output_layout``).
    ``check_finite=False`` skips the sync and the check: only for callers that check
    the inputs otherwise (and benchmarks). ``cfg`` overrides tile settings (benchmarks).
    """
    fmt, names, records = _prepare(weights, fmt, names, outs)
    if not records:
        return []
    flags = torch.zeros(len(records), dtype=torch.int32, device=weights[0].device)
    _launch_all(fmt, weights, records, flags, **cfg)
    if check_finite:
        raise_if_nonfinite(fmt, flags, weights, names)
    return records


def quantize_weight_gpu(w: torch.Tensor, fmt: Format | str, name: str = "weight", *,
                        out: QuantizedTensor | None = None, check_finite: bool = True, **cfg) -> QuantizedTensor:
    """``fmt.quantize_weight(w, name)`` on the GPU, bit for bit; ``out`` is written in place."""
    return quantize_weights_gpu([w], fmt, [name], outs=None if out is None else [out],
                                check_finite=check_finite, **cfg)[0]


GRAPH_BRANCHES = 4  # parallel streams of a QuantizePlan's graph (its docstring)


def _balanced_chunks(sizes: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """Cut ``range(len(sizes))`` into at most ``parts`` contiguous [start, stop) ranges of
    about equal total size (each non-empty)."""
    total, bounds, start, acc = sum(sizes), [], 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if len(bounds) < parts - 1 and acc * parts >= total * (len(bounds) + 1) and i + 1 < len(sizes):
            bounds.append((start, i + 1))
            start = i + 1
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


class QuantizePlan:
    """A fixed list of weights quantized by one CUDA-graph replay per update.

    The weights and the output buffers must keep their storage between runs (an
    optimizer updating parameters in place does); the values may change freely.
    Construction runs the kernels once eagerly (compiling them, and checking the
    weights), then captures the launches. ``use_graph=False`` keeps eager launches.

    ``branches``: the captured graph quantizes that many contiguous chunks of the list
    (about equal bytes each) on parallel streams. One kernel per weight leaves the GPU
    part-empty on small weights (a 1024x2048 k_proj is 128 blocks for 132 SMs) and at
    every kernel's tail; kernels of independent weights side by side fill it.
    """

    def __init__(self, weights: Sequence[torch.Tensor], fmt: Format | str, names: Sequence[str] | None = None, *,
                 outs: Sequence[QuantizedTensor] | None = None, use_graph: bool = True, branches: int = GRAPH_BRANCHES, **cfg):
        self.format, self.names, self.outputs = _prepare(weights, fmt, names, outs)
        self.weights = list(weights)
        for w, name in zip(self.weights, self.names):
            if not w.is_contiguous():
                raise QuantrollError(f"tensor '{name}' is not contiguous; a QuantizePlan reads weights in place")
        device = self.weights[0].device if self.weights else torch.device("cpu")
        self.flags = torch.zeros(len(self.weights), dtype=torch.int32, device=device)
        self._cfg = cfg
        self.graph = None
        self._launch()
        raise_if_nonfinite(self.format, self.flags, self.weights, self.names)
        if use_graph and device.type == "cuda" and self.weights:
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._launch(branches)
            self.graph = graph

    def _launch(self, branches: int = 1) -> None:
        if not self.weights:
            return
        self.flags.zero_()
        chunks = _balanced_chunks([w.numel() for w in self.weights], branches)
        if len(chunks) == 1:
            _launch_all(self.format, self.weights, self.outputs, self.flags, **self._cfg)
            return
        main = torch.cuda.current_stream(self.flags.device)
        streams = [main] + [torch.cuda.Stream(self.flags.device) for _ in chunks[1:]]
        for stream, (a, b) in zip(streams, chunks):
            if stream is not main:
                stream.wait_stream(main)
            with torch.cuda.stream(stream):
                _launch_all(self.format, self.weights[a:b], self.outputs[a:b], self.flags[a:b], **self._cfg)
        for stream in streams[1:]:
            main.wait_stream(stream)

    def run(self, check_finite: bool = True) -> list[QuantizedTensor]:
        """Quantize the current values into the same output buffers."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._launch()
        if check_finite and self.weights:
            raise_if_nonfinite(self.format, self.flags, self.weights, self.names)
        return self.outputs


__all__ = [
    "GPU_INPUT_DTYPES",
    "QuantizePlan",
    "allocate_quantized",
    "bad_weights",
    "output_layout",
    "quantize_weight_gpu",
    "quantize_weights_gpu",
    "raise_if_nonfinite",
    "triton_available",
]
