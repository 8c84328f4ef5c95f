"""Measurements of a step: pure functions over tensors that return Python floats."""
