"""quantroll: RL post-training with low-precision rollout and BF16 training."""

from quantroll.errors import QuantrollError

__version__ = "0.1.0"
__all__ = ["QuantrollError", "__version__"]
