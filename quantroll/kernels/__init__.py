"""GPU fast paths, each one tested bit for bit against the pure reference in formats/.

Nothing here imports triton at import time: the package imports on CPU-only machines,
and a kernel is compiled only when first launched.
"""

from quantroll.kernels.quantize import (
    GPU_INPUT_DTYPES,
    QuantizePlan,
    allocate_quantized,
    bad_weights,
    output_layout,
    quantize_weight_gpu,
    quantize_weights_gpu,
    raise_if_nonfinite,
    triton_available,
)

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
