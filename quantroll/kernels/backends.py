"""The registry of QLinear forward backends: name -> (layer, x) -> y.

It sits in kernels (which depend on formats only) so that a kernel module registers its
backend without importing the model, and model/linear.py looks backends up here: the
model depends on the kernels, never the reverse. "emulated" (the exact reference, CPU
and GPU) is registered by model/linear.py; "fp8" (real FP8 GEMMs) by kernels/fp8_linear.py
when imported, which the engine does before it selects that backend.

A format whose weights have real kernels registers them in ``HARDWARE`` (format name ->
backend name and where it runs), so the engine asks for the format's backend instead of
naming one: block FP8 registers "fp8" (Hopper and newer); MXFP8 and NVFP4 have none built,
so they run the exact emulation everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BACKENDS: dict[str, Callable] = {}


@dataclass(frozen=True)
class HardwareBackend:
    backend: str  # its name in BACKENDS
    available: Callable  # (device) -> bool: whether that device runs it


HARDWARE: dict[str, HardwareBackend] = {}


def hardware_backend(fmt) -> HardwareBackend | None:
    """The real-kernel backend registered for ``fmt`` (None: exact emulation only)."""
    return HARDWARE.get(fmt.name)
