"""The registry of QLinear forward backends: name -> (layer, x) -> y.

It sits in kernels (which depend on formats only) so that a kernel module registers its
backend without importing the model, and model/linear.py looks backends up here: the
model depends on the kernels, never the reverse. "emulated" (the exact reference, CPU
and GPU) is registered by model/linear.py; "fp8" (real FP8 GEMMs) by kernels/fp8_linear.py
when imported, which the engine does before it selects that backend.

A format whose weights have real kernels has an entry in ``HARDWARE`` (format name ->
backend name and where it runs), so the engine asks for the format's backend instead of
naming one: block FP8's is "fp8" (sm_89 and newer); MXFP8 and NVFP4 have none built, so
they run the exact emulation everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BACKENDS: dict[str, Callable] = {}


@dataclass(frozen=True)
class HardwareBackend:
    backend: str  # its name in BACKENDS
    available: Callable  # (device) -> bool: whether that device runs it


def fp8_hardware_available(device=None) -> bool:
    """Whether ``device`` (None: the current CUDA device) runs the real FP8 GEMMs: a CUDA
    GPU with FP8 tensor cores (sm_89+) and Triton. A CPU device never does, also on a
    machine with a GPU."""
    import torch

    from quantroll.kernels.quantize import triton_available

    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available() and triton_available() and torch.cuda.get_device_capability(device) >= (8, 9)


# declared here, not in the kernel modules, so that asking costs no kernel import:
# block FP8's weights run kernels/fp8_linear.py's GEMMs (BACKENDS["fp8"] once imported)
HARDWARE: dict[str, HardwareBackend] = {"fp8": HardwareBackend("fp8", fp8_hardware_available)}


def hardware_backend(fmt) -> HardwareBackend | None:
    """The real-kernel backend registered for ``fmt`` (None: exact emulation only)."""
    return HARDWARE.get(fmt.name)
