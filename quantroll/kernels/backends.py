"""The registry of QLinear forward backends: name -> (layer, x) -> y.

It sits in kernels (which depend on formats only) so that a kernel module registers its
backend without importing the model, and model/linear.py looks backends up here: the
model depends on the kernels, never the reverse. "emulated" (the exact reference, CPU
and GPU) is registered by model/linear.py; "fp8" (real FP8 GEMMs) by kernels/fp8_linear.py
when imported, which the engine does before it selects that backend.
"""

from __future__ import annotations

from collections.abc import Callable

BACKENDS: dict[str, Callable] = {}
