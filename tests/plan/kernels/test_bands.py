"""Dealing padded-layout items to steps: heavy items share steps, nothing is lost."""

from __future__ import annotations

import numpy as np

from varpack.plan.kernels.bands import deal_band_items


def _deal(heavy: list[bool], bounds: list[int], per_step: int, dp: int) -> list[list[int]]:
    n = len(heavy)
    cost = np.where(heavy, 10.0, 1.0)
    out = deal_band_items(
        np.arange(n + 1), np.array(bounds), np.array(heavy), cost, per_step, dp
    ).tolist()
    assert sorted(out) == list(range(n))  # every item once
    return [out[i : i + per_step] for i in range(0, n, per_step)]


def test_a_lone_heavy_item_waits_for_a_partner():
    # two windows of four items, one heavy item in each, two ranks: the first heavy item
    # waits one window and shares a step with the second (nobody waits on a lone heavy rank)
    steps = _deal([False, False, False, True, False, False, False, True], [0, 4, 8], 2, 2)
    assert [3, 7] in [sorted(s) for s in steps]


def test_a_heavy_item_waits_only_once():
    # heavy items in windows 0 and 1 of three, never a partner in time: the first waits once
    # and is placed in window 1 (with the second, which then need not wait)
    heavy = [False] * 12
    heavy[3] = True
    steps = _deal(heavy, [0, 4, 8, 12], 2, 4)
    assert any(3 in s for s in steps[:4])


def test_whole_groups_are_not_held_back():
    steps = _deal([True, True, False, False], [0, 4], 2, 2)
    assert sorted(steps[0]) == [0, 1]
