"""The rollout engine: Engine (generate, load_weights) and SamplingParams."""

from quantroll.engine.engine import Engine, GenerationResult
from quantroll.engine.sampling import SamplingParams

__all__ = ["Engine", "GenerationResult", "SamplingParams"]
