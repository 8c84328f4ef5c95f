"""A BF16 model whose chosen linears compute in the rollout format: one model, any subset.

The trainer's BF16 model and the engine's model loaded from the full conversion share
module names, so keeping "only these modules low precision" is a swap of children: the
BF16 model borrows the converted model's quantized linears for the duration of a
forward pass and gets its own back afterwards. The borrowed layers hold exactly the
codes and scales ``convert`` wrote (fused scale groups included), and compute the
format emulated (quantized activations, dequantized weights, float32 products), which is
what the engine computes on a CPU and the numerics of its real FP8 GEMMs to rounding.
Nothing is copied and the BF16 weights are never touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from quantroll.model.causal_lm import CausalLM
from quantroll.model.linear import QLinear


class Hybrid:
    def __init__(self, bf16: CausalLM, converted: CausalLM):
        self.model = bf16.eval()
        self.quantized: dict[str, QLinear] = converted.quantized_linears()
        self._slots: dict[str, tuple[object, str, QLinear]] = {}
        for parent in self.model.modules():
            for attr, child in parent.named_children():
                if isinstance(child, QLinear) and child.name in self.quantized:
                    self._slots[child.name] = (parent, attr, child)
        missing = sorted(set(self.quantized) - set(self._slots))
        if missing:
            raise ValueError(f"converted linears without a BF16 twin: {missing[:3]}")

    @contextlib.contextmanager
    def low_precision(self, modules: Iterable[str]):
        """The model with ``modules`` (names of quantized linears) in the rollout format."""
        chosen = [m for m in modules]
        unknown = [m for m in chosen if m not in self._slots]
        if unknown:
            raise KeyError(f"not a quantized linear of the conversion: {unknown[0]}")
        try:
            for m in chosen:
                parent, attr, _ = self._slots[m]
                setattr(parent, attr, self.quantized[m])
            yield self.model
        finally:
            for m in chosen:
                parent, attr, own = self._slots[m]
                setattr(parent, attr, own)

    def bf16_linear(self, module: str) -> QLinear:
        return self._slots[module][2]
