"""Push the trainer's BF16 weights into the engine, in the engine's format, in place.

Every weight the engine holds quantized is re-quantized by the rules the checkpoint
was made with (``quantize_for_checkpoint``: the format with its MXFP8 scale rule, and
NVFP4's global scale shared within fused q/k/v and gate/up), so that an update of
unchanged weights reproduces the checkpoint bit for bit. Quantize and load are timed
separately: on small models the per-update quantization can cost more than FP8 saves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from quantroll.checkpoint.plan import scale_group
from quantroll.checkpoint.quantize import quantize_for_checkpoint, tensor_amax
from quantroll.kernels.quantize_launch import gpu_quantizer
from quantroll.formats import QuantizedTensor


@dataclass(frozen=True)
class SyncTiming:
    quantize_s: float
    load_s: float
    version: int
    copy_s: float  # one device copy of the engine's weight bytes (copy_reference.py): the update's unit

    def metrics(self) -> dict[str, float]:
        """The metrics line's entries for this update."""
        return {"weight_quantize_time": self.quantize_s, "weight_load_time": self.load_s,
                "weight_copy_time": self.copy_s, "weight_version": self.version}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class WeightSync:
    def __init__(self, engine, direct: bool = True):
        """direct: on one CUDA device, quantize straight into the engine's buffers
        (quantroll/sync/direct.py); False keeps the quantize-then-load path everywhere."""
        self.engine = engine
        self.direct = direct
        self._direct = None
        self._direct_key: tuple = ()
        self.format = engine.format
        # modules the engine stores quantized, by checkpoint name (fused parents excluded)
        self.quantized = set(engine.quantized_layers())
        # on a GPU with triton, quantize every weight of an update by one CUDA-graph replay
        # (formats whose kernels registered a GPU quantizer; the others quantize on the reference)
        self._gpu_path = (self.format is not None and engine.device.type == "cuda" and engine.gpu_kernels
                          and gpu_quantizer(self.format) is not None)
        self._plan = None  # QuantizePlan over the trainer's tensors, rebuilt if their storage changes
        self._plan_key: tuple = ()
        self._copy_s: float | None = None  # measured at the first push

    def copy_seconds(self) -> float:
        """One device copy of the engine's weight bytes, measured once (copy_reference.py)."""
        if self._copy_s is None:
            from quantroll.sync.copy_reference import copy_seconds, engine_weight_bytes

            self._copy_s = copy_seconds(engine_weight_bytes(self.engine), self.engine.device)
        return self._copy_s

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
        """The update as the engine stores it: QuantizedTensor for quantized weights."""
        shared = self._shared_amaxes(named)
        out: dict[str, torch.Tensor | QuantizedTensor] = {}
        gpu: list[str] = []  # weights for the batched Triton path (bit-identical to the reference)
        for name, tensor in named.items():
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and module in self.quantized:
                w = tensor.detach().to(self.engine.device)
                if self._gpu_path and name not in shared:
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

    def _direct_update(self, named: Mapping[str, torch.Tensor]):
        """The copy-speed path (quantroll/sync/direct.py) for these tensors, or None where it
        does not apply (every CPU run, NVFP4, tensors on another device)."""
        from quantroll.sync.direct import DirectUpdate, direct_applies

        if not self.direct:
            return None
        # the names and storages of the last update: what its graphs were built on. A tensor
        # re-allocated (moved, cast, replaced through .data) has a new data_ptr, so this key,
        # cheap enough for every update (the full check of direct_applies is not), finds it.
        key = (tuple(named), [t.data_ptr() for t in named.values()])
        if self._direct is not None and key == self._direct_key:
            return self._direct
        self._direct = None  # free the old graphs first
        if not direct_applies(self.engine, named):
            return None
        self._direct = DirectUpdate(self.engine, named)
        self._direct_key = key
        return self._direct

    @torch.no_grad()
    def push(self, named: Mapping[str, torch.Tensor]) -> SyncTiming:
        """Quantize and load one update; returns the two times and the new weight version."""
        device = self.engine.device
        copy_s = self.copy_seconds()
        direct = self._direct_update(named)
        if direct is not None:  # quantize into the engine's buffers: "load" is the BF16 copy and the checks
            _sync(device)
            t0 = time.perf_counter()
            quantize_s, version = direct.run()
            total = time.perf_counter() - t0
            return SyncTiming(quantize_s, max(total - quantize_s, 0.0), version, copy_s)
        _sync(device)
        t0 = time.perf_counter()
        update = self.quantize(named)
        _sync(device)
        t1 = time.perf_counter()
        version = self.engine.load_weights(update.items())
        _sync(device)
        return SyncTiming(t1 - t0, time.perf_counter() - t1, version, copy_s)
