"""Plans balanced in a real model's FLOPs: the cost the planner uses, plans scored independently
in it, and the quadratic the composer prices samples by (exact without sliding windows)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from varpack.plan import PlanConfig, make_plan
from varpack.plan.cost import (
    bound_coefficients,
    cost_coefficients,
    exact_quadratic,
    sample_cost,
    window_fit,
)
from varpack.plan.models import PRESET_CONFIGS, preset_spec
from varpack.plan.models.flops import attention_flops, linear_per_token

FULL = [n for n in sorted(PRESET_CONFIGS) if all(w is None for w in preset_spec(n).windows)]
WINDOWED = [n for n in sorted(PRESET_CONFIGS) if n not in FULL]


def _cost(lens: np.ndarray, name: str) -> np.ndarray:
    """Training FLOPs of each sample alone, summed here from the spec's parts (3 x forward)."""
    spec = preset_spec(name)
    s = np.asarray(lens, dtype=np.float64)
    return 3.0 * (linear_per_token(spec) * s + attention_flops(s, spec))


def _time(p, cost_of) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """A plan's time over its ideal under each sync, from its samples' costs alone."""
    lens = p.lens[p.stream]
    micro = np.add.reduceat(cost_of(lens), p.offsets[:-1])
    cfg, n = p.cfg, p.num_steps
    loads = np.zeros((n, cfg.dp, cfg.grad_accum))
    loads[p.step, p.rank, p.micro_index] = micro
    ideal = cost_of(p.lens).sum() * cfg.epochs / cfg.dp
    return {
        "step": loads.sum(axis=2).max(axis=1).sum() / ideal,
        "micro": loads.max(axis=1).sum() / ideal,
    }


def _heavy_tail(n: int, rng: np.random.Generator) -> np.ndarray:
    """Chat lengths with 0.5 % long documents of 20 to 32 K tokens."""
    lens = np.clip(rng.lognormal(6.5, 1.0, n), 16, 16000).astype(np.int64)
    long = rng.random(n) < 0.005
    lens[long] = rng.integers(20000, 32768, int(long.sum()))
    return lens


@pytest.mark.parametrize("name", FULL)
def test_the_quadratic_is_exact_without_windows(name: str) -> None:
    cfg = PlanConfig(max_tokens=32768, cost="flops", model_preset=name).resolved()
    lin, quad = cost_coefficients(cfg.cost_model())
    s = np.array([1, 2, 17, 1000, 4096, 32768, 131072], dtype=np.float64)
    assert lin * s + quad * s * s == pytest.approx(_cost(s, name), rel=1e-12)
    assert sample_cost(s, cfg.cost_model()) == pytest.approx(_cost(s, name), rel=1e-12)
    assert exact_quadratic(cfg.cost_model())


@pytest.mark.parametrize("name", WINDOWED)
@pytest.mark.parametrize("span", [2048, 16384, 32768])
def test_windows_fit_a_quadratic_and_bound_it(name: str, span: int) -> None:
    cfg = PlanConfig(max_tokens=span, cost="flops", model_preset=name).resolved()
    model = cfg.cost_model()
    s = np.arange(1, span + 1, dtype=np.float64)
    exact = _cost(s, name)
    lin, quad = cost_coefficients(model)
    assert lin >= 0 and quad >= 0 and (lin, quad) == window_fit(preset_spec(name), span)
    err = (lin * s + quad * s * s) / exact - 1
    assert np.abs(err[span // 8 :]).max() < 0.03  # where a micro-batch's tokens are
    assert np.abs(err).max() < 0.08
    assert sample_cost(s, model) == pytest.approx(exact, rel=1e-12)  # what sums are made of
    up_lin, up_quad = bound_coefficients(model)
    assert (up_lin * s + up_quad * s * s >= exact * (1 - 1e-12)).all()
    beyond = all(w is None or w >= span for w in preset_spec(name).windows)
    assert exact_quadratic(model) == beyond


@pytest.mark.parametrize(
    ("name", "k", "sync"),
    [
        ("qwen2.5-0.5b", 4, "step"),
        ("qwen2.5-0.5b", 4, "micro"),
        ("mistral-7b-v0.1", 4, "step"),
        ("gemma-2-2b", 4, "micro"),
    ],
)
def test_plans_are_balanced_in_the_real_cost(name: str, k: int, sync: str) -> None:
    """Shuffled, dp 8, grad-accum 4, a heavy tail at 32 K: scored by the model's own per-sample
    FLOPs, the plan is within 1 % of its ideal under its sync, and no worse than the same plan
    balanced by Skrull's formula at the model's dimensions."""
    lens = _heavy_tail(60_000, np.random.default_rng(7))
    cfg = PlanConfig(max_tokens=32768, dp=8, grad_accum=k, sync=sync, order="shuffle",
                     cost="flops", model_preset=name, seed=1)  # fmt: skip
    p, meta, _ = make_plan(np.arange(len(lens)), lens, cfg)
    got = _time(p, lambda x: _cost(x, name))
    assert got[sync] == pytest.approx(meta["stats"]["time_vs_ideal"], rel=1e-9)
    assert got[sync] <= 1.01
    assert meta["stats"]["time_vs_ideal_bound"] <= meta["stats"]["time_vs_ideal"] + 1e-12
    spec = preset_spec(name)
    skrull = dataclasses.replace(cfg, model_preset=None, hidden=spec.hidden,
                                 kv_hidden=spec.kv_dim, layers=spec.layers)  # fmt: skip
    old, _, _ = make_plan(np.arange(len(lens)), lens, skrull.resolved())
    assert got[sync] <= _time(old, lambda x: _cost(x, name))[sync] + 1e-3


def test_grad_accum_1_beats_skrull_in_the_real_cost() -> None:
    lens = _heavy_tail(30_000, np.random.default_rng(3))
    cfg = PlanConfig(max_tokens=32768, dp=16, order="shuffle", cost="flops",
                     model_preset="qwen2.5-0.5b")  # fmt: skip
    p, _, _ = make_plan(np.arange(len(lens)), lens, cfg)
    got = _time(p, lambda x: _cost(x, "qwen2.5-0.5b"))["micro"]
    skrull = PlanConfig(max_tokens=32768, dp=16, order="shuffle", cost="flops", hidden=896,
                        kv_hidden=128, layers=24)  # fmt: skip
    old, _, _ = make_plan(np.arange(len(lens)), lens, skrull)
    assert got <= 1.05 and got <= _time(old, lambda x: _cost(x, "qwen2.5-0.5b"))["micro"] + 1e-3


def test_the_plan_records_its_model_and_plans_alike_from_it() -> None:
    lens = _heavy_tail(5000, np.random.default_rng(5))
    cfg = PlanConfig(max_tokens=32768, dp=2, grad_accum=2, order="shuffle", cost="flops",
                     model_preset="gemma-2-2b")  # fmt: skip
    a, meta, _ = make_plan(np.arange(len(lens)), lens, cfg)
    recorded = meta["config"]
    assert recorded["model"] == preset_spec("gemma-2-2b").to_dict()
    assert recorded["model_digest"] == preset_spec("gemma-2-2b").digest()
    again = PlanConfig.from_mapping({**recorded, "model_preset": None})
    b, meta_b, _ = make_plan(np.arange(len(lens)), lens, again)
    assert np.array_equal(a.stream, b.stream) and np.array_equal(a.offsets, b.offsets)
    assert meta_b["stats"] == meta["stats"]
    plain = make_plan(np.arange(len(lens)), lens, PlanConfig(max_tokens=32768))[1]["config"]
    assert "model" not in plain and "model_digest" not in plain
