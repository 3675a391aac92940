"""Fixtures shared by every test folder (helpers to import live in ``testkit.py``)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
