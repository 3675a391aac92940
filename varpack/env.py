"""Numbers read from environment variables: a bad value is one line naming the variable.

>>> import os
>>> os.environ["VARPACK_DOCTEST"] = "abc"
>>> env_int("VARPACK_DOCTEST", 3)
Traceback (most recent call last):
varpack.errors.ConfigError: environment variable VARPACK_DOCTEST='abc' is not an integer; unset it or give an integer >= 0
>>> del os.environ["VARPACK_DOCTEST"]
>>> env_int("VARPACK_DOCTEST", 3)
3
"""

from __future__ import annotations

import math
import os

from varpack.errors import ConfigError


def env_int(name: str, default: int, low: int = 0) -> int:
    """``int(os.environ[name])``, ``default`` when unset; at least ``low``."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    fix = f"unset it or give an integer >= {low}"
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={text!r} is not an integer; {fix}"
        ) from None
    if value < low:
        raise ConfigError(f"environment variable {name}={text!r} is below {low}; {fix}")
    return value


def env_float(name: str, default: float, low: float = 0.0) -> float:
    """``float(os.environ[name])``, ``default`` when unset; finite and at least ``low``."""
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= low):
        raise ConfigError(
            f"environment variable {name}={text!r} is not a finite number >= {low:g}; unset it "
            "or fix it"
        )
    return value
