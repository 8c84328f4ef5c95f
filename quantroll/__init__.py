"""quantroll: RL post-training with low-precision rollout and BF16 training."""

from quantroll.errors import QuantrollError
from quantroll.version import __version__

__all__ = ["Engine", "SamplingParams", "QuantrollError", "__version__"]


def __getattr__(name: str):
    """``from quantroll import Engine, SamplingParams`` without importing the engine for every command."""
    if name in ("Engine", "SamplingParams"):
        from quantroll import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'quantroll' has no attribute {name!r}")
