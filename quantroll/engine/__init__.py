"""The rollout engine: Engine (generate, load_weights), SamplingParams, and the KV cache
and scheduler settings (CacheConfig, SchedulerConfig)."""

from quantroll.engine.engine import Engine, GenerationResult
from quantroll.engine.paged_cache import CacheConfig
from quantroll.engine.sampling import SamplingParams
from quantroll.engine.scheduler import SchedulerConfig

__all__ = ["CacheConfig", "Engine", "GenerationResult", "SamplingParams", "SchedulerConfig"]
