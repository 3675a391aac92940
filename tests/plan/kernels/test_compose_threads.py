"""The composer on several threads: byte for byte the one-thread composition, whatever the
number of threads, where carries cross the runs, where a carry is not resolved within the
prefix, and through a whole plan."""

from __future__ import annotations

import numpy as np
import pytest

import varpack.plan.kernels.compose_threads as ct
from varpack.errors import ConfigError
from varpack.metadata.synth import sample_lengths
from varpack.plan import PlanConfig, make_plan
from varpack.plan.kernels.compose import compose_run
from varpack.plan.kernels.compose_threads import compose_threaded, default_threads, run_starts

COEFFS = (1.0, 1 / 3000)


def _lens(shape: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if shape == "heavy":  # chat-like with 0.5 % near the budget: heavy samples held, carried
        x = np.exp(rng.normal(np.log(450), 0.9, n))
        x[rng.random(n) < 0.005] = rng.uniform(12_000, 16_000, 1)
        return np.clip(np.rint(x), 1, 16384).astype(np.int64)
    return sample_lengths(shape, n, rng, max_len=16384).astype(np.int64)


def _args(k: int, dp: int = 8, fill: float = 0.75) -> tuple:  # type: ignore[type-arg]
    step = int(dp * k * 16384 * 0.75)
    return COEFFS, 8 * step, step, dp, k, 1, 16384, fill


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    if a is None or b is None:
        return a is b
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


class _Spy:
    """Counts the carries resolved and the runs whose rest was composed again."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.resolved = self.redone = 0
        orig = ct._Run._from

        def spy(run, j, carry, held, found):  # type: ignore[no-untyped-def]
            out = orig(run, j, carry, held, found)
            if found is not None:
                self.resolved += 1
                self.redone += out[-1] is not found[-1]
            return out

        monkeypatch.setattr(ct._Run, "_from", spy)


@pytest.mark.parametrize("shape", ["long-tail", "heavy", "bimodal"])
@pytest.mark.parametrize(("k", "mix"), [(1, False), (1, True), (4, False)])
def test_threads_compose_the_one_thread_plan(shape, k, mix, monkeypatch):
    lens = _lens(shape, 60_000)
    alone = np.zeros(len(lens), dtype=np.bool_)
    want = compose_run(lens, alone, *_args(k), None, None, True, mix)
    spy = _Spy(monkeypatch)
    for threads in (2, 3, 5):
        got = compose_threaded(lens, alone, *_args(k), None, True, mix, threads, min_run=6_000)
        assert _same(got, want), (threads, shape, k, mix)
    assert spy.resolved > 0  # carries came into runs and were resolved


def test_a_carry_not_resolved_in_the_prefix_composes_the_rest_again(monkeypatch):
    monkeypatch.setattr(ct, "PREFIX", 1)
    lens = _lens("heavy", 60_000, seed=3)
    alone = np.zeros(len(lens), dtype=np.bool_)
    want = compose_run(lens, alone, *_args(1), None, None, True, False)
    spy = _Spy(monkeypatch)
    got = compose_threaded(lens, alone, *_args(1), None, True, False, 6, min_run=4_000)
    assert _same(got, want)
    assert spy.redone > 0


def test_a_blend_and_samples_alone_compose_alike():
    rng = np.random.default_rng(1)
    lens = _lens("long-tail", 50_000)
    alone = rng.random(len(lens)) < 0.01
    sources = (rng.integers(0, 3, len(lens)), np.array([0.3, 0.5, 0.2]), 0.02)
    want = compose_run(lens, alone, *_args(2), sources, None, True, False)
    got = compose_threaded(lens, alone, *_args(2), sources, True, False, 4, min_run=5_000)
    assert _same(got, want)


def test_an_epoch_too_small_for_runs_is_composed_in_one():
    lens = _lens("long-tail", 3_000)
    alone = np.zeros(len(lens), dtype=np.bool_)
    want = compose_run(lens, alone, *_args(4), None, None, True, False)
    assert _same(compose_threaded(lens, alone, *_args(4), None, True, False, 8), want)
    # runs so short that the epoch's tail would join their windows: fewer runs, same result
    got = compose_threaded(lens, alone, *_args(4), None, True, False, 8, min_run=10)
    assert _same(got, want)


def test_run_starts_fall_on_window_starts():
    lens = _lens("long-tail", 40_000)
    window = 200_000
    pos, cum = run_starts(lens, window, 4, 3)
    before = np.concatenate(([0], np.cumsum(lens)[:-1]))
    for r in range(4):
        assert pos[r, 0] >= 0 and np.all(np.diff(pos[r]) > 0)
        for p, c in zip(pos[r], cum[r], strict=True):
            assert before[p] == c
            assert p == 0 or before[p] // window != before[p - 1] // window
    assert np.all(np.diff(pos[:, 0]) > 0)


@pytest.mark.parametrize(
    ("k", "sync", "budget", "extra"),
    [
        (1, "micro", 16384, {}),
        (4, "micro", 16384, {}),
        (4, "step", 16384, {}),
        (1, "micro", 4096, {"oversize": "split"}),  # documents split into budget-sized pieces
        (2, "micro", 4096, {"oversize": "split"}),
    ],
)
def test_plans_are_the_same_whatever_the_threads(k, sync, budget, extra, monkeypatch):
    monkeypatch.setattr(ct, "MIN_RUN", 5_000)
    lens = np.sort(_lens("heavy", 40_000))
    cfg = PlanConfig(max_tokens=budget, dp=8, grad_accum=k, cost="flops",
                     model_preset="qwen2.5-0.5b", order="shuffle", sync=sync, epochs=2,
                     **extra)  # fmt: skip
    plans = []
    for threads in ("1", "4"):
        monkeypatch.setenv(ct.THREADS_ENV, threads)
        arrays, meta, _ = make_plan(np.arange(len(lens)), lens, cfg)
        plans.append((arrays.stream.tobytes(), arrays.offsets.tobytes(), arrays.rank.tobytes(),
                      meta["stats"]["time_vs_ideal"]))  # fmt: skip
    assert plans[0] == plans[1]


def test_the_thread_count_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(ct.THREADS_ENV, "3")
    assert default_threads() == 3
    monkeypatch.delenv(ct.THREADS_ENV)
    assert 1 <= default_threads() <= ct.MAX_THREADS
    for bad in ("many", "0"):
        monkeypatch.setenv(ct.THREADS_ENV, bad)
        with pytest.raises(ConfigError, match=f"VARPACK_THREADS='{bad}'"):
            default_threads()
