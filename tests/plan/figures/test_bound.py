"""The per-plan lower bound on time vs ideal (``plan/figures/bound.py``): no plan beats it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.errors import ConfigError
from varpack.plan import PlanConfig, make_plan
from varpack.plan.cost import cost_coefficients, sample_cost
from varpack.plan.figures.bound import time_bound

FLOPS = dict(cost="flops", model_preset="qwen2.5-0.5b")


def _mix(seed: int, n: int, long_share: float, budget: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.exp(rng.normal(np.log(budget / 40), 1.0, n))
    long = rng.random(n) < long_share
    x[long] = budget * (1 - 0.4 * rng.random(int(long.sum())))
    return np.sort(np.clip(np.rint(x), 1, budget).astype(np.int64))


configs = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 50),
        "n": st.integers(200, 3000),
        "long_share": st.sampled_from([0.0, 0.002, 0.01, 0.05, 0.3]),
        "dp": st.integers(1, 8),
        "grad_accum": st.sampled_from([1, 2, 4]),
        "order": st.sampled_from(["shuffle", "curriculum"]),
        "compose": st.sampled_from(["cost", "tokens"]),
        "layout": st.sampled_from(["packed", "padded"]),
        "window": st.integers(1, 8),
    }
)


@settings(max_examples=40, deadline=None)
@given(c=configs)
def test_no_plan_is_faster_than_its_bound(c):
    # the bound holds for every plan, whatever composed it: a failure here is a bound that lies
    lens = _mix(c["seed"], c["n"], c["long_share"], 2048)
    cfg = PlanConfig(max_tokens=2048, dp=c["dp"], grad_accum=c["grad_accum"], order=c["order"],
                     compose=c["compose"], layout=c["layout"], shuffle_window=c["window"],
                     **FLOPS)  # fmt: skip
    try:
        stats = make_plan(np.arange(len(lens)), lens, cfg)[1]["stats"]
    except ConfigError as exc:  # too few samples for whole steps: one clear error
        assert "cannot" in str(exc), exc
        return
    assert 1.0 <= stats["time_vs_ideal_bound"] <= stats["time_vs_ideal"] + 1e-9


def test_a_window_of_a_few_long_samples_cannot_be_levelled():
    # grad-accum 1: a step holding one long sample waits on it; more long samples per window
    # (a longer --shuffle-window) make whole groups of dp possible, and the bound falls
    lens = _mix(0, 20_000, 0.002, 16384)
    bounds = []
    for window in (1, 8, 64):
        cfg = PlanConfig(max_tokens=16384, dp=8, order="shuffle", shuffle_window=window, **FLOPS)
        bounds.append(make_plan(np.arange(len(lens)), lens, cfg)[1]["stats"]["time_vs_ideal_bound"])
    assert bounds[0] > bounds[1] > bounds[2] > 1.0


def test_linear_costs_leave_nothing_to_wait_for():
    lens = _mix(1, 5000, 0.05, 4096)
    cfg = PlanConfig(max_tokens=4096, dp=4, order="shuffle")  # tokens cost
    assert make_plan(np.arange(5000), lens, cfg)[1]["stats"]["time_vs_ideal_bound"] == 1.0


def test_the_bound_of_a_hand_made_step():
    # dp 2, K 1, cost x^2: one long sample (100, the cap) and short ones of 10; whatever the
    # composition, the long one's step lasts 100^2 while the other rank carries the 50 short
    # tokens, each priced at the top of its length bin (11: a valid over-estimate of 10)
    lens = np.array([100] + [10] * 5)
    ideal = float((lens.astype(float) ** 2).sum())  # 10,500
    b = time_bound(sample_step=np.zeros(6, np.int64), sample_len=lens, step_tokens=np.array([150]),
                   epochs=[(0, 1)], window=1, dp=2, k=1, cap=100, coeffs=(0.0, 1.0),
                   ideal_cost=ideal)  # fmt: skip
    idle = 100.0**2 - 50 * 11  # the other rank waits at least this
    assert b == 1.0 + idle / ideal


def test_coefficients_match_the_cost_model():
    model = PlanConfig(max_tokens=64, **FLOPS).resolved().cost_model()
    lin, quad = cost_coefficients(model)
    x = np.array([7.0, 300.0])
    assert np.allclose(lin * x + quad * x * x, sample_cost(x, model))


def _partitions(items: list[int]):  # type: ignore[no-untyped-def]
    """Every set partition of ``items`` (lists of blocks)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for b in range(len(part)):
            yield [*part[:b], [first, *part[b]], *part[b + 1 :]]


def _least_time(lens: np.ndarray, dp: int, cap: int, lin: float, quad: float) -> float:
    """The least sum over slots of their costliest micro-batch, over every composition of
    ``lens`` into micro-batches within ``cap`` (sorted runs of ``dp`` cut them into slots best;
    empty micro-batches allowed, which only lowers it)."""
    best = np.inf
    for part in _partitions(list(range(len(lens)))):
        if any(lens[b].sum() > cap for b in part):
            continue
        c = sorted((float((lin * lens[b] + quad * lens[b].astype(float) ** 2).sum()) for b in part),
                   reverse=True)  # fmt: skip
        best = min(best, sum(c[::dp]))
    return best


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 100), min_size=2, max_size=7),
    dp=st.integers(2, 3),
    coeffs=st.sampled_from([(0.0, 1.0), (1.0, 0.02), (5.0, 0.01)]),
)
def test_no_composition_of_a_window_beats_its_bound(lens, dp, coeffs):
    # grad-accum 1 (and every --sync micro plan): the bound, both relaxations together, is
    # never above the best of every way to compose the window's samples, found by brute force
    x = np.array(lens, dtype=np.int64)
    lin, quad = coeffs
    total = float((lin * x + quad * x.astype(float) ** 2).sum())
    b = time_bound(sample_step=np.zeros(len(x), np.int64), sample_len=x,
                   step_tokens=np.array([x.sum()]), epochs=[(0, 1)], window=1, dp=dp, k=1,
                   cap=100, coeffs=coeffs, ideal_cost=total)  # fmt: skip
    assert b <= dp * _least_time(x, dp, 100, lin, quad) / total + 1e-9


def test_the_light_samples_beside_long_ones_are_counted_once():
    # dp 3, K 1, cost x^2: the 100 makes its step last 10,000 whatever else is in it; the two
    # 60s beside it have 40 tokens of room each, and both would fill it with the one 40-token
    # sample if each rank counted the light samples on its own (1,764 each, priced at its
    # bin's top, 42). Shared, the two ranks carry at most the 40 and the two 20s (42 * 40 +
    # 21 * 40), so they wait at least 2 * 6,400 less that; the best composition waits a little more
    x = np.array([100, 60, 60, 40, 20, 20])
    total = float((x.astype(float) ** 2).sum())
    b = time_bound(sample_step=np.zeros(6, np.int64), sample_len=x, step_tokens=np.array([300]),
                   epochs=[(0, 1)], window=1, dp=3, k=1, cap=100, coeffs=(0.0, 1.0),
                   ideal_cost=total)  # fmt: skip
    assert b == 1.0 + (2 * (100.0**2 - 60.0**2) - (42 * 40 + 21 * 40)) / total
    assert b <= 3 * _least_time(x, 3, 100, 0.0, 1.0) / total
