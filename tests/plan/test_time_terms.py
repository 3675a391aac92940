"""``--cost time`` with the four-term model (seconds per linear FLOP, per attention FLOP, per
sample, per micro-batch): plans scored in seconds by an independent sum, the quadratic the
composer prices by, and the options' refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from varpack.errors import ConfigError
from varpack.plan import PlanConfig, make_plan
from varpack.plan.cost import bound_coefficients, cost_coefficients, exact_quadratic, sample_cost
from varpack.plan.models import preset_spec
from varpack.plan.models.flops import attention_flops, linear_per_token

TERMS: dict[str, Any] = {"time_per_linear_flop": 2e-15, "time_per_attention_flop": 7e-15,
         "time_per_sequence": 4e-4, "time_per_micro_batch": 3e-3}  # fmt: skip


def _seconds(lens: np.ndarray, name: str) -> np.ndarray:
    """A sample's seconds alone, from the spec's parts (3 x forward)."""
    spec = preset_spec(name)
    s = np.asarray(lens, dtype=np.float64)
    return (TERMS["time_per_linear_flop"] * 3.0 * linear_per_token(spec) * s
            + TERMS["time_per_attention_flop"] * 3.0 * attention_flops(s, spec)
            + TERMS["time_per_sequence"])  # fmt: skip


def _lens(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(6.5, 1.0, n), 16, 16000).astype(np.int64)
    long = rng.random(n) < 0.01
    lens[long] = rng.integers(12000, 16384, int(long.sum()))
    return lens


@pytest.mark.parametrize(("name", "layout"), [("qwen2.5-0.5b", "packed"),
                                              ("gemma-2-2b", "packed"),
                                              ("qwen2.5-0.5b", "padded")])  # fmt: skip
def test_time_vs_ideal_is_the_plans_seconds_over_its_ideal(name: str, layout: str) -> None:
    lens = _lens(6000, 2)
    cfg = PlanConfig(max_tokens=16384, dp=4, grad_accum=2, order="shuffle", cost="time",
                     model_preset=name, layout=layout, pad_multiple=64, seed=3, sync="step",
                     **TERMS)  # fmt: skip
    p, meta, _ = make_plan(np.arange(len(lens)), lens, cfg)
    spec = preset_spec(name)
    pad_to = p.micro.pad_to.astype(np.float64)
    count = np.diff(p.offsets)
    if layout == "packed":
        tokens = np.add.reduceat(p.lens[p.stream].astype(np.float64), p.offsets[:-1])
        pad = TERMS["time_per_linear_flop"] * 3.0 * linear_per_token(spec) * (pad_to - tokens)
        micro = np.add.reduceat(_seconds(p.lens[p.stream], name), p.offsets[:-1]) + pad
    else:
        micro = p.micro.rows * _seconds(pad_to, name)
    micro = micro + TERMS["time_per_micro_batch"]
    assert count.sum() == len(p.stream)
    loads = np.zeros((p.num_steps, cfg.dp, cfg.grad_accum))
    loads[p.step, p.rank, p.micro_index] = micro
    ideal = _seconds(p.lens, name).sum() * cfg.epochs / cfg.dp
    got = loads.sum(axis=2).max(axis=1).sum() / ideal
    stats = meta["stats"]
    assert got == pytest.approx(stats["time_vs_ideal"], rel=1e-9)
    assert stats["ideal_time"] == pytest.approx(ideal, rel=1e-9)  # seconds
    assert stats["time_vs_ideal_bound"] <= stats["time_vs_ideal"] + 1e-12
    again = PlanConfig.from_mapping(meta["config"])
    b, meta_b, _ = make_plan(np.arange(len(lens)), lens, again)
    assert np.array_equal(p.stream, b.stream) and np.array_equal(p.offsets, b.offsets)
    assert meta_b["stats"] == stats
    assert {k: meta["config"][k] for k in TERMS} == TERMS
    assert "time_per_flop" not in meta["config"]


def test_the_composer_prices_by_the_weighted_quadratic() -> None:
    """Without windows the FLOP terms are the quadratic exactly; the per-sample seconds are not
    in it (and the bound's quadratic covers them per token)."""
    cfg = PlanConfig(max_tokens=16384, cost="time", model_preset="qwen2.5-0.5b", **TERMS)
    model = cfg.resolved().cost_model()
    lin, quad = cost_coefficients(model)
    s = np.array([1.0, 100.0, 4096.0, 16384.0])
    c = TERMS["time_per_sequence"]
    assert lin * s + quad * s * s + c == pytest.approx(_seconds(s, "qwen2.5-0.5b"), rel=1e-12)
    assert np.allclose(sample_cost(s, model), _seconds(s, "qwen2.5-0.5b"), rtol=1e-12)
    assert not exact_quadratic(model)
    blin, bquad = bound_coefficients(model)
    assert (blin * s + bquad * s * s >= sample_cost(s, model)).all()
    no_c = PlanConfig(max_tokens=16384, cost="time", model_preset="qwen2.5-0.5b",
                      **{**TERMS, "time_per_sequence": 0.0}).resolved().cost_model()  # fmt: skip
    assert exact_quadratic(no_c)


def test_windows_fit_the_weighted_cost() -> None:
    cfg = PlanConfig(max_tokens=32768, cost="time", model_preset="gemma-2-2b", **TERMS)
    model = cfg.resolved().cost_model()
    lin, quad = cost_coefficients(model)
    s = np.array([2048.0, 8192.0, 32768.0])
    exact = sample_cost(s, model) - TERMS["time_per_sequence"]
    assert np.abs((lin * s + quad * s * s) / exact - 1).max() < 0.05


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"cost": "flops"}, "--time-per-linear-flop is used by --cost time only"),
        ({"time_per_flop": 1e-12}, "conflicts with --time-per-flop"),
        ({"time_per_attention_flop": None}, "needs both --time-per-linear-flop and"),
        ({"time_per_linear_flop": 0.0, "time_per_attention_flop": 0.0}, "are both 0"),
        ({"time_per_sequence": -1.0}, "--time-per-sequence -1.0: must be a finite number >= 0"),
        ({"time_per_micro_batch": 1e21}, "--time-per-micro-batch 1e+21"),
        ({"model_preset": None, "hidden": 64, "kv_hidden": 16, "layers": 2}, "needs the model"),
        ({"cp": 2, "bucket_size": 8192}, "--cp 2 conflicts with the four-term time model"),
    ],
)
def test_refusals_are_one_config_error(extra: dict[str, Any], message: str) -> None:
    opts: dict[str, Any] = {
        "max_tokens": 16384,
        "cost": "time",
        "model_preset": "qwen2.5-0.5b",
        **TERMS,
        **extra,
    }
    with pytest.raises(ConfigError, match="^[^\n]*$") as err:
        PlanConfig(**opts).resolved()
    assert message in str(err.value)


def test_other_plans_keep_their_config_keys() -> None:
    lens = _lens(500, 1)
    meta = make_plan(np.arange(len(lens)), lens, PlanConfig(max_tokens=16384, cost="time",
                     model_preset="qwen2.5-0.5b", time_per_flop=1e-12))[1]  # fmt: skip
    assert not any(k in meta["config"] for k in TERMS)
