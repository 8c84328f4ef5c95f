"""An update's weights in the engine's format: the quantization half of a weight sync.

Every weight the engine holds quantized is re-quantized by the rules the checkpoint was
made with (``quantize_for_checkpoint``: the format with its MXFP8 scale rule, and NVFP4's
global scale shared within fused q/k/v and gate/up), so that an update of unchanged
weights reproduces the checkpoint bit for bit. The engine here is a description (format,
which layers are quantized); it may live on the meta device: the quantization runs on
``device`` (the one-process sync: the engine's; the cross-process broadcast's source: its
trainer GPU, which holds no engine of its own).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from quantroll.checkpoint.plan import scale_group
from quantroll.checkpoint.quantize import quantize_for_checkpoint, tensor_amax
from quantroll.formats import QuantizedTensor
from quantroll.kernels.quantize import triton_available
from quantroll.kernels.quantize_launch import gpu_quantizer


class UpdateQuantizer:
    def __init__(self, engine, device: str | torch.device | None = None):
        self.device = torch.device(device) if device is not None else engine.device
        if self.device.type == "meta":
            raise ValueError("an update is quantized on a real device; the engine is on the meta device, so pass one")
        self.format = engine.format
        # modules the engine stores quantized, by checkpoint name (fused parents excluded)
        self.quantized = set(engine.quantized_layers())
        # on a GPU with triton, every weight of an update by one CUDA-graph replay (formats
        # whose kernels registered a GPU quantizer; the others quantize on the reference),
        # bit-identical to the reference (tests/kernels/test_quantize_gpu.py)
        self.gpu_path = (self.format is not None and self.device.type == "cuda" and triton_available()
                         and gpu_quantizer(self.format) is not None)
        self._plan = None  # QuantizePlan over the trainer's tensors, rebuilt if their storage changes
        self._plan_key: tuple = ()

    def _shared_amaxes(self, named: Mapping[str, torch.Tensor]) -> dict[str, float]:
        if self.format is None or not self.format.shared_global_scale:
            return {}
        groups: dict[str, list[str]] = {}
        for name in named:
            module = name.removesuffix(".weight")
            if module in self.quantized and (key := scale_group(module)) is not None:
                groups.setdefault(key, []).append(name)
        shared = {}
        for names in groups.values():
            amax = max(tensor_amax(named[n]) for n in names)
            shared.update({n: amax for n in names})
        return shared

    def quantize(self, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor | QuantizedTensor]:
        """The update as the engine stores it: QuantizedTensor for quantized weights, the
        other tensors as they are."""
        shared = self._shared_amaxes(named)
        out: dict[str, torch.Tensor | QuantizedTensor] = {}
        gpu: list[str] = []  # weights for the batched Triton path
        for name, tensor in named.items():
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and module in self.quantized:
                w = tensor.detach().to(self.device)
                if self.gpu_path and name not in shared:
                    gpu.append(name)
                    out[name] = w
                else:
                    out[name] = quantize_for_checkpoint(self.format, w, name, shared.get(name))
            else:
                out[name] = tensor.detach()
        if gpu:
            for name, q in zip(gpu, self._quantize_gpu([out[n] for n in gpu], gpu)):
                out[name] = q
        return out

    def _quantize_gpu(self, weights: list[torch.Tensor], names: list[str]) -> list[QuantizedTensor]:
        """One graph replay when the trainer's tensors are the ones seen before (an
        optimizer updates them in place, so from the second update on); the plan is
        built, and its first run made eagerly, otherwise. Outputs are the plan's own
        buffers, overwritten by the next update (load_weights copies them first)."""
        from quantroll.kernels import QuantizePlan

        key = tuple((n, w.data_ptr(), tuple(w.shape), w.dtype) for n, w in zip(names, weights))
        if self._plan is None or key != self._plan_key:
            self._plan = None  # free the old buffers first
            self._plan = QuantizePlan(weights, self.format, names)
            self._plan_key = key
            return list(self._plan.outputs)
        return self._plan.run(check_finite=True)
