"""What a `--sync step` composition at grad-accum >= 2 does for mixing: heavy groups strided
over their costs where they level, big-but-light samples dealt with the rest, and a stratified
share of a window's overflow moved on (not its lightest samples)."""

from __future__ import annotations

import numpy as np
import pytest

from varpack.plan import PlanConfig, make_plan
from varpack.plan.kernels.heavy import cost, grouping, heavy_prefix, strided
from varpack.plan.kernels.window import _move_on

FLOPS = dict(cost="flops", model_preset="qwen2.5-0.5b")


def _rollouts(n: int, seed: int) -> np.ndarray:
    """Prompt + response, a quarter of the responses cut at an 8 K generation cap."""
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(np.exp(rng.normal(np.log(350), 0.7, n))), 16, 4096)
    response = np.clip(np.rint(np.exp(rng.normal(np.log(4200), 1.0, n))), 1, 8192)
    return np.sort((prompt + response).astype(np.int64))


def _heavy_tail(n: int, seed: int) -> np.ndarray:
    """Chat-like lengths with 0.5 % of samples at 20-32 K tokens."""
    rng = np.random.default_rng(seed)
    x = np.exp(rng.normal(np.log(450), 0.9, n))
    long = rng.random(n) < 0.005
    x[long] = rng.uniform(20_000, 32_000, int(long.sum()))
    return np.sort(np.clip(np.rint(x), 1, 32768).astype(np.int64))


def _stats(lens: np.ndarray, **kw: object) -> dict:  # type: ignore[type-arg]
    cfg = PlanConfig(order="shuffle", sync="step", grad_accum=2, **FLOPS, **kw)  # type: ignore[arg-type]
    return make_plan(np.arange(len(lens)), lens, cfg)[1]["stats"]


@pytest.mark.parametrize("seed", [0, 1])
def test_rollout_steps_mix_at_grad_accum_2(seed: int) -> None:
    # every sample over 8 K is heavy; sorted groups gave each step one band of them (0.16)
    s = _stats(_rollouts(24_000, seed), max_tokens=16384, dp=16)
    assert s["mixing"] <= 0.15
    assert s["time_vs_ideal"] <= 1.03


@pytest.mark.parametrize("seed", [0, 1])
def test_heavy_tail_steps_mix_at_grad_accum_2(seed: int) -> None:
    # steps of 32 heavy samples give up fill; their window's lightest samples used to move on
    # together and crowd the next window's first steps (0.21)
    s = _stats(_heavy_tail(200_000, seed), max_tokens=32768, dp=32)
    assert s["mixing"] <= 0.15
    assert s["time_vs_ideal"] <= 1.03


def test_move_on_takes_a_stratified_share() -> None:
    lens = np.arange(1000, 0, -1, dtype=np.int64)  # order: costliest first
    order = np.arange(1000)
    done = np.zeros(1000, dtype=np.bool_)
    room = np.array([0.6 * lens.sum() / 2] * 2)  # the steps take 60 % of the tokens
    _move_on(order, 0, 10, done, lens, order, room)
    moved = lens[done]
    assert not done[:10].any()  # carried in: placed first, never moved on again
    assert abs(moved.sum() / lens.sum() - 0.4) < 0.02
    # every length range gives its share, not the lightest tail
    for lo in range(0, 1000, 200):
        assert 0.3 < done[lo : lo + 200].mean() < 0.5


def test_move_on_moves_nothing_where_the_steps_have_room() -> None:
    lens = np.full(100, 10, dtype=np.int64)
    done = np.zeros(100, dtype=np.bool_)
    _move_on(np.arange(100), 0, 0, done, lens, np.arange(100), np.array([600.0, 600.0]))
    assert not done.any()


def test_big_samples_are_heavy_by_their_size_only_at_grad_accum_1() -> None:
    lens = np.array([3000] + [100] * 99, dtype=np.int64)
    buf = np.arange(100)
    order = np.arange(100)
    held = np.zeros(100, dtype=np.bool_)
    assert heavy_prefix(buf, order, lens, 1.0, 1e-6, 4096, held, 1)[0] == 1
    assert heavy_prefix(buf, order, lens, 1.0, 1e-6, 4096, held, 2)[0] == 0
    # heavy by cost stays heavy at any grad-accum
    assert heavy_prefix(buf, order, lens, 1.0, 1e-3, 4096, held, 4)[0] == 1


def test_strided_groups_only_where_every_group_levels() -> None:
    lens = np.array([4000, 3900, 3800, 3700, 3600, 3500, 3400, 3300], dtype=np.int64)
    order = np.arange(8)
    group = grouping(order, 0, 8, 4, False, lens, order, 1.0, 1e-6)
    assert group.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    density = 1.0
    out = strided(group, order, 8, order, lens, 1.0, 1e-6, 2, 4096, density, 4, 4096.0)
    assert out.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    for g in range(2):  # each strided group spans the heavy lengths
        assert lens[out == g].max() - lens[out == g].min() >= 600
    # a quadratic cost the light samples cannot make up: sorted groups stay
    steep = strided(group, order, 8, order, lens, 1.0, 1e-2, 2, 4096, density, 4, 1e12)
    assert steep.tolist() == group.tolist()
    assert cost(4000, 1.0, 1e-2) > cost(3400, 1.0, 1e-2) + (2 * 4096 - 4000) * density
    # more groups than steps (dealt in a snake) or grad-accum 1: as they are
    assert strided(group, order, 8, order, lens, 1.0, 1e-6, 2, 4096, density, 1, 1e12) is group
    assert strided(group, order, 8, order, lens, 1.0, 1e-6, 1, 4096, density, 4, 1e12) is group
    # the fill its slots would give up to level is more than a step may give (--pp: none)
    assert strided(group, order, 8, order, lens, 1.0, 1e-6, 2, 4096, density, 4, 0.0) is group


def test_pp_plans_keep_sorted_groups() -> None:
    # with --pp a step gives up no fill, so a strided group could not level: as balanced as
    # sorted groups (the long-SFT tail ran 1.08x with strided ones)
    rng = np.random.default_rng(1)
    lens = rng.lognormal(np.log(450), 0.9, 30_000)
    long = rng.random(30_000) < 0.0011
    lens[long] = 16384 * (1 - 0.25 * rng.random(int(long.sum())))
    lens = np.sort(np.clip(np.rint(lens), 1, 16384).astype(np.int64))
    cfg = PlanConfig(order="shuffle", sync="step", grad_accum=4, pp=4, max_tokens=16384, dp=8,
                     **FLOPS)  # type: ignore[arg-type]  # fmt: skip
    s = make_plan(np.arange(len(lens)), lens, cfg)[1]["stats"]
    assert s["time_vs_ideal"] <= 1.03
