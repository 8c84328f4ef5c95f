"""Trainer -> engine weight updates, and the first-update check. The one place that
knows both sides: the engine never imports the trainer, nor the trainer the engine."""

from quantroll.sync.check import WeightUpdateMismatch, check_weight_update
from quantroll.sync.weight_sync import SyncTiming, WeightSync

__all__ = ["SyncTiming", "WeightSync", "WeightUpdateMismatch", "check_weight_update"]
