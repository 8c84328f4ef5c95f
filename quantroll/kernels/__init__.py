"""GPU fast paths, each one tested bit for bit against the pure reference in formats/.

Nothing here imports triton at import time: the package imports on CPU-only machines,
and a kernel is compiled only when first launched.
"""

from quantroll.kernels import quantize as _quantize
from quantroll.kernels.quantize import *  # noqa: F403  (the weight-quantize API: quantize.__all__)

__all__ = list(_quantize.__all__)
