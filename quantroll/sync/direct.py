"""The one-GPU weight update at copy speed: quantize straight into the engine's buffers.

The general path (weight_sync.py) quantizes into buffers of its own, then
``Engine.load_weights`` checks every entry and copies it into the engine: the quantized
bytes are written twice and read once more, and the load walks the tensors in Python.
Here, when trainer and engine share one CUDA device:

- every quantized weight goes through one CUDA-graph replay of the Triton quantizer
  (``QuantizePlan`` with ``outs=`` the engine's own code and scale buffers: the codes are
  written once, where the engine reads them; fused q/k/v and gate/up parts are row views
  of the fused buffers, so those update too);
- every BF16 tensor (embedding, norms, lm_head, BF16-kept layers) is one
  ``torch._foreach_copy_``, captured in a second graph;
- the checks are batched: the quantizer's per-weight finiteness flags, and one
  ``_foreach_norm`` over the BF16 sources (a NaN or Inf makes its norm non-finite), read
  back in one host sync.

The price: the check comes after the writes, so an update holding NaN/Inf leaves the
engine with a broken update; it raises NonFiniteError naming the tensor and the run stops
(the engine is never sampled from again). Formats whose quantizer needs a global scale
shared across fused siblings (NVFP4) keep the general path.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from quantroll.errors import NonFiniteError

DIRECT_FORMATS = (None, "fp8", "mxfp8")


def direct_applies(engine, named: Mapping[str, torch.Tensor]) -> bool:
    """Whether this update can take the direct path (one CUDA device, a graphable format,
    contiguous BF16 sources of the engine's shapes)."""
    if engine.device.type != "cuda" or not engine.gpu_kernels:
        return False
    if (engine.format.name if engine.format is not None else None) not in DIRECT_FORMATS:
        return False
    return all(t.device == engine.device and t.dtype == torch.bfloat16 and t.is_contiguous() for t in named.values())


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
        self.norms = None
        self.copy_graph = None
        if plain_src:
            self._copy()  # eager once (warm-up), then captured
            torch.cuda.synchronize(engine.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._copy()
            self.copy_graph = graph

    def _copy(self) -> None:
        self.norms = torch.stack(torch._foreach_norm(self.plain_src))
        torch._foreach_copy_(self.plain_dst, self.plain_src)

    def quantize(self) -> None:
        """Quantize every quantized weight into the engine (raises on NaN/Inf: the run stops)."""
        if self.plan is not None:
            self.plan.run(check_finite=True)

    def copy(self) -> int:
        """Copy the BF16 tensors into the engine, check them, bump the version."""
        if self.copy_graph is not None:
            self.copy_graph.replay()
            ok = torch.isfinite(self.norms).cpu()
            if not bool(ok.all()):
                name = self.plain_names[int((~ok).nonzero()[0])]
                raise NonFiniteError(f"weight update: '{name}' holds NaN/Inf (written into the engine: the run must "
                                     "stop)", tensor=name)
        for layer in self.to_invalidate:
            layer.invalidate()
        return self.engine.load_weights([], commit=True)
