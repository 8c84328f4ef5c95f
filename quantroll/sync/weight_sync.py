"""Push the trainer's BF16 weights into the engine, in the engine's format, in place.

The quantization is update_quantizer.py's (the checkpoint's own rules, so an update of
unchanged weights reproduces the checkpoint bit for bit); on one CUDA device the update
goes straight into the engine's buffers instead (direct.py). Quantize and load are timed
separately: on small models the per-update quantization can cost more than FP8 saves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from quantroll.formats import QuantizedTensor
from quantroll.sync.copy_reference import synchronize
from quantroll.sync.update_quantizer import UpdateQuantizer


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


class WeightSync:
    def __init__(self, engine, direct: bool = True):
        """direct: on one CUDA device, quantize straight into the engine's buffers
        (quantroll/sync/direct.py); False keeps the quantize-then-load path everywhere."""
        self.engine = engine
        self.direct = direct
        self._direct = None
        self._direct_key: tuple = ()
        self.quantizer = UpdateQuantizer(engine)
        self._copy_s: float | None = None  # measured at the first push

    def copy_seconds(self) -> float:
        """One device copy of the engine's weight bytes, measured once (copy_reference.py)."""
        if self._copy_s is None:
            from quantroll.sync.copy_reference import copy_seconds, engine_weight_bytes

            self._copy_s = copy_seconds(engine_weight_bytes(self.engine), self.engine.device)
        return self._copy_s

    def quantize(self, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor | QuantizedTensor]:
        """The update as the engine stores it: QuantizedTensor for quantized weights."""
        return self.quantizer.quantize(named)

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
            synchronize(device)
            t0 = time.perf_counter()
            quantize_s, version = direct.run()
            total = time.perf_counter() - t0
            return SyncTiming(quantize_s, max(total - quantize_s, 0.0), version, copy_s)
        synchronize(device)
        t0 = time.perf_counter()
        update = self.quantize(named)
        synchronize(device)
        t1 = time.perf_counter()
        version = self.engine.load_weights(update.items())
        synchronize(device)
        return SyncTiming(t1 - t0, time.perf_counter() - t1, version, copy_s)
