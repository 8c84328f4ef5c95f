"""The one-GPU weight update at copy speed: quantize straight into the engine's buffers.

The general path (weight_sync.py) quantizes into buffers of its own, then
``Engine.load_weights`` checks every entry and copies it into the engine: the quantized
bytes are written twice and read once more, and the load walks the tensors in Python.
Here, when trainer and engine share one CUDA device:

- every quantized weight goes through one CUDA-graph replay of the Triton quantizer
  (``QuantizePlan`` with ``outs=`` the engine's own code and scale buffers: the codes are
  written once, where the engine reads them; fused q/k/v and gate/up parts are row views
  of the fused buffers, so those update too);
- every BF16 tensor (embedding, norms, lm_head, BF16-kept layers) is copied by a kernel
  that also flags a source holding NaN/Inf in the same read (kernels/copy_check.py),
  captured in a second graph;
- the checks are batched: the quantizer's per-weight finiteness flags and the copy's
  flags are read back together, in the update's one host sync (``run``); the quantize
  time is the GPU time between two events around its replay, not a second sync.

The price: the check comes after the writes, so an update holding NaN/Inf leaves the
engine with a broken update; it raises NonFiniteError naming the tensor and the run stops
(the engine is never sampled from again). Formats whose quantizer needs a global scale
shared across fused siblings (NVFP4) keep the general path.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from quantroll.errors import NonFiniteError
from quantroll.kernels.counters import device_key
from quantroll.kernels.quantize import triton_available
from quantroll.kernels.quantize_launch import gpu_quantizer


def direct_applies(engine, named: Mapping[str, torch.Tensor]) -> bool:
    """Whether this update can take the direct path (one CUDA device with Triton, a
    graphable format, contiguous BF16 sources of the engine's shapes). Not the engine's
    ``gpu_kernels``: that is its forward's choice (off in true on-policy mode, where the
    forward runs the invariant kernels), while the update's quantizer is bit-identical to
    the reference either way, as the general path's Triton plan is (update_quantizer.py)."""
    if engine.device.type != "cuda" or not triton_available():
        return False
    if engine.format is not None and not getattr(gpu_quantizer(engine.format), "direct", False):
        return False  # BF16, or a format whose GPU quantizer writes engine buffers in place
    device = device_key(engine.device)  # "cuda" and "cuda:0" are one device; torch.device's == says not
    return all(device_key(t.device) == device and t.dtype == torch.bfloat16 and t.is_contiguous()
               for t in named.values())


class DirectUpdate:
    """A fixed set of trainer tensors (their storage must not move: an optimizer writing in
    place keeps it) bound to the engine's buffers; ``run`` is the whole update."""

    def __init__(self, engine, named: Mapping[str, torch.Tensor]):
        from quantroll.kernels import QuantizePlan

        self.engine = engine
        layers = engine.quantized_layers()
        params = engine.weight_parameters()
        q_names, q_src, q_out, self.plain_names, plain_src, plain_dst = [], [], [], [], [], []
        for name, t in named.items():
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and module in layers:
                q_names.append(name)
                q_src.append(t.detach())
                q_out.append(layers[module].quantized_weight())
            else:
                self.plain_names.append(name)
                plain_src.append(t.detach())
                plain_dst.append(params[name])
        self.q_names = q_names
        self.plain_src, self.plain_dst = plain_src, plain_dst
        # layers whose forward caches a dequantized copy (emulated formats) must drop it after each update
        self.to_invalidate = [layers[n.removesuffix(".weight")] for n in q_names
                              if layers[n.removesuffix(".weight")].backend == "emulated"]
        self.plan = QuantizePlan(q_src, engine.format, q_names, outs=q_out) if q_src else None
        self.flags = torch.zeros(len(plain_src), dtype=torch.int32, device=engine.device)
        self.tables = None
        self.copy_graph = None
        if plain_src:
            self._copy()  # eager once (warm-up), then captured
            torch.cuda.synchronize(engine.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._copy()
            self.copy_graph = graph

    def _copy(self) -> None:
        from quantroll.kernels.copy_check import copy_and_flag

        self.tables = copy_and_flag(self.plain_src, self.plain_dst, self.flags, self.tables)

    def run(self) -> tuple[float, int]:
        """The whole update: both replays, then one host sync that reads every flag (raises
        NonFiniteError naming the first bad tensor: the run must stop). Returns (the quantize
        replay's GPU seconds, the new weight version)."""
        from quantroll.kernels.quantize import bad_weights

        start, mid = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if self.plan is not None:
            self.plan.run(check_finite=False)
        mid.record()
        if self.copy_graph is not None:
            self.copy_graph.replay()
        parts = ([bad_weights(self.engine.format, self.plan.flags).to(torch.int32)] if self.plan is not None else [])
        bad = torch.cat([*parts, self.flags]).cpu()  # the one sync
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            if i < len(self.q_names):
                self.plan.run(check_finite=True)  # raises the quantizer's own message for that weight
            name = self.plain_names[i - len(self.q_names)]
            raise NonFiniteError(f"weight update: '{name}' holds NaN/Inf (written into the engine: the run must "
                                 "stop)", tensor=name)
        for layer in self.to_invalidate:
            layer.invalidate()
        return start.elapsed_time(mid) / 1e3, self.engine.load_weights([], commit=True)
