"""The balance benchmark's scorer (``tests/benchmarks/real_cost.py``) against varpack's cost.

The benchmark scores plans by a second count of each real model's FLOPs, written from the
config's fields without varpack's cost code. These tests hold the two counts together: per
sample for every bundled model, against the definition summed position by position, and per
plan, where plan.json's own time figures must be the scorer's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import plan_balance  # noqa: E402
import real_cost  # noqa: E402

from varpack.plan import PlanConfig, make_plan  # noqa: E402
from varpack.plan.models import PRESET_CONFIGS, preset_spec  # noqa: E402
from varpack.plan.models.flops import sample_train_flops  # noqa: E402

LENGTHS = np.array([1, 2, 511, 512, 513, 2047, 2048, 4095, 4096, 4097, 9000, 32768, 65536])


@pytest.mark.parametrize("name", sorted(PRESET_CONFIGS))
def test_scorer_counts_what_varpack_counts(name: str) -> None:
    got = real_cost.RealModel.of(name).sample_cost(LENGTHS)
    want = sample_train_flops(LENGTHS, preset_spec(name))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_scorer_is_the_definition_position_by_position() -> None:
    config = {"model_type": "gemma2", "hidden_size": 16, "intermediate_size": 40,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
              "num_hidden_layers": 3, "vocab_size": 50, "sliding_window": 5}  # fmt: skip
    m = real_cost.RealModel.of_config("tiny", config)
    assert m.windows == (5, None, 5)
    lin = 2 * 16 * (16 + 2 * 8 + 16) + 3 * 2 * 16 * 40  # q, k, v, o; gated MLP
    for s in (1, 4, 5, 6, 13):
        keys = sum(min(i, w or i) for w in m.windows for i in range(1, s + 1))
        want = 3 * (s * (3 * lin + 2 * 16 * 50) + 4 * 16 * keys)
        assert m.sample_cost(np.array([s]))[0] == want


@pytest.mark.parametrize(("k", "sync"), [(1, "step"), (2, "step"), (2, "micro")])
def test_plan_times_are_plan_json_figures(k: int, sync: str) -> None:
    lens = np.sort(plan_balance.heavy_tail(3000, np.random.default_rng(0), cap=8192))
    cfg = PlanConfig(max_tokens=8192, dp=4, grad_accum=k, sync=sync, cost="flops",
                     model_preset="mistral-7b-v0.1", order="shuffle")  # fmt: skip
    arrays, meta, _ = make_plan(np.arange(len(lens)), lens, cfg)
    got = real_cost.times(arrays, real_cost.RealModel.of("mistral-7b-v0.1"))
    want = meta["stats"]["time_vs_ideal_by_sync"]
    assert got == pytest.approx(want, rel=1e-9)
    assert got[sync] > 1.0  # a real plan waits a little: the figure is not the ideal itself


def test_targets() -> None:
    assert plan_balance.target(4, 1.0099, 2.0) == "ok"
    assert plan_balance.target(16, 1.0101, 1.0) == "MISS"
    assert plan_balance.target(1, 1.04, 1.03) == "MISS"  # slower than the old formula's plan
    assert plan_balance.target(1, 1.051, 1.2) == "MISS"
    assert plan_balance.target(1, 1.03, 1.03) == "ok"
    assert plan_balance.target(2, 1.5, 1.0) == "-"
