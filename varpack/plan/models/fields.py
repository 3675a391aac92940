"""Reading a model's config.json fields: each bad one refused in one line naming it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from varpack.errors import ConfigError


class Fields:
    """Reads a config's fields, refusing a bad one in one line naming it and ``where``."""

    def __init__(self, config: Mapping[str, Any], where: str,
                 needs: str = "the FLOPs model needs it (is this a decoder model's config.json?)"
                 ) -> None:  # fmt: skip
        self.config = config
        self.where = where
        self.needs = needs  # what a missing size is said to be needed for

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.where}: {what}")

    def size(self, key: str, *aliases: str, zero: bool = False) -> int:
        """A required positive integer (``zero``: >= 0)."""
        for name in (key, *aliases):
            if name in self.config and self.config[name] is not None:
                return self._int(name, self.config[name], zero)
        raise self.fail(f"no {key}; {self.needs}")

    def value(self, key: str, default: int | None, *aliases: str, zero: bool = False) -> int | None:
        """An optional integer (under ``key`` or an alias): ``default`` when absent, None when
        null."""
        for name in (key, *aliases):
            if name in self.config:
                v = self.config[name]
                return None if v is None else self._int(name, v, zero)
        return default

    def flag(self, key: str, default: bool) -> bool:
        v = self.config.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.fail(f"{key} is {v!r}; must be true or false")
        return v

    def layer_list(self, key: str) -> list[Any] | None:
        v = self.config.get(key)
        if v is None:
            return None
        if not isinstance(v, list):
            raise self.fail(f"{key} is {v!r}; must be a list")
        return v

    def _int(self, key: str, v: Any, zero: bool) -> int:
        low = 0 if zero else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise self.fail(f"{key} is {v!r}; must be an integer >= {low}")
        return v
