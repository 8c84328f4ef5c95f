"""Typed reads of JSON objects (config.json, generation_config.json, quantization_config):
one-line errors that name the key. Shared by the model config, the checkpoint's
quantization config and the engine, so it sits below all of them."""

from __future__ import annotations

from quantroll.errors import QuantrollError

_REQUIRED = object()


class JsonFields:
    """Typed reads of one JSON object: a wrong type, a null where a value is required, or a
    value out of range is a one-line error naming the key (``where`` prefixes it)."""

    def __init__(self, raw: dict, source: str, where: str = ""):
        self.raw, self.source, self.where = raw, source, where

    def _get(self, key: str, default):
        """The value; ``default`` where the key is absent or null (``_REQUIRED``: an error)."""
        value = self.raw.get(key)
        if value is None and default is _REQUIRED:
            what = "is null; it needs a value" if key in self.raw else "is missing"
            raise QuantrollError(f"{self.source}: required key '{self.where}{key}' {what}")
        return default if value is None else value

    def _bad(self, key: str, what: str, value) -> QuantrollError:
        return QuantrollError(f"{self.source}: '{self.where}{key}' must be {what}, got {value!r}")

    def int(self, key: str, default=_REQUIRED, minimum: int | None = None) -> int | None:
        value = self._get(key, default)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer", value)
        if minimum is not None and value < minimum:
            raise self._bad(key, f"an integer >= {minimum}", value)
        return value

    def float(self, key: str, default=_REQUIRED, positive: bool = False) -> float | None:
        value = self._get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(key, "a number", value)
        if positive and not value > 0:
            raise self._bad(key, "a positive number", value)
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def ints(self, key: str) -> tuple[int, ...]:
        value = self._get(key, [])
        if isinstance(value, bool) or not isinstance(value, (list, int)):
            raise self._bad(key, "an integer or a list of integers", value)
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise self._bad(key, "an integer or a list of integers", value)
        return tuple(items)
