"""Fixtures shared by every test folder (helpers to import live in ``testkit.py``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (``derandomize``), so a run of the suite
# is reproducible and CI cannot fail on a draw no one can replay; ``HYPOTHESIS_PROFILE=explore``
# draws new ones (and keeps failures in the example database) when hunting for bugs.
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
