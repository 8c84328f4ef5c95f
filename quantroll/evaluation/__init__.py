"""Held-out evaluation through the rollout engine (KV cache, batched), by length bucket."""
