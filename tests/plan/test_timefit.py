"""The time model ``a_lin linear + a_attn attention + c sequences + b`` fitted by exact NNLS."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from varpack.errors import InputError, VarpackError
from varpack.plan.calibrate import fit_line
from varpack.plan.models import ModelSpec
from varpack.plan.models.flops import linear_per_token, train_flops
from varpack.plan.timefit import (
    TERMS,
    Features,
    fit_time,
    holdout_mask,
    micro_features,
    nnls,
    predict,
)

SPEC = ModelSpec("llama", 256, 4, 4, 2, 64, 688, True, 8192, (None,) * 4)
TRUE = dict(zip(TERMS, [2e-11, 5e-11, 5e-3, 2e-2], strict=True))


def _rows(n: int = 60, seed: int = 0) -> tuple[Features, np.ndarray]:
    """Micro-batches of three kinds: many short samples, a few long ones, one sample alone."""
    rng = np.random.default_rng(seed)
    lens, offsets, pad_to, kinds = [], [0], [], []
    for i in range(n):
        kind = ("chat", "rollout", "single")[i % 3]
        if kind == "chat":
            x = rng.integers(20, 300, rng.integers(5, 40))
        elif kind == "rollout":
            x = rng.integers(500, 3000, rng.integers(1, 4))
        else:
            x = rng.integers(256, 8192, 1)
        lens += x.tolist()
        offsets.append(len(lens))
        pad_to.append(-(-int(x.sum()) // 64) * 64)
        kinds.append(kind)
    f = micro_features(np.array(lens), np.array(offsets), np.array(pad_to), SPEC)
    return f, np.array(kinds)


def _law(f: Features, coef: dict[str, float]) -> np.ndarray:
    return predict(coef, f)


def test_exact_recovery_of_known_coefficients() -> None:
    f, kinds = _rows()
    got = fit_time(f, _law(f, TRUE), kinds, holdout=3)
    for t in TERMS:
        assert got[t] == pytest.approx(TRUE[t], rel=1e-9)
    assert got["terms_at_zero"] == []
    assert got["time_error_held_out"]["max_pct"] < 1e-7
    assert got["time_error"]["max_pct"] < 1e-7


def test_recovery_with_noise_within_tolerance() -> None:
    f, kinds = _rows(300)
    y = _law(f, TRUE) * np.random.default_rng(1).normal(1.0, 0.01, len(kinds))  # 1 % noise
    got = fit_time(f, y, kinds, holdout=4)
    assert got["time_per_linear_flop"] == pytest.approx(TRUE["time_per_linear_flop"], rel=0.03)
    assert got["time_per_attention_flop"] == pytest.approx(TRUE["time_per_attention_flop"], rel=0.1)
    assert got["time_per_micro_batch"] == pytest.approx(TRUE["time_per_micro_batch"], rel=0.2)
    assert got["time_per_sequence"] == pytest.approx(TRUE["time_per_sequence"], rel=0.2)
    assert got["time_error_held_out"]["mean_pct"] < 1.5
    # the old model cannot follow attention's own rate and the per-sequence cost
    assert (
        got["flops_line"]["time_error_held_out"]["mean_pct"]
        > got["time_error_held_out"]["mean_pct"]
    )


def test_a_negative_coefficient_is_clamped_and_the_others_refitted() -> None:
    f, kinds = _rows()
    law = dict(TRUE, time_per_sequence=-2e-4)  # the rows "gain" time per sequence
    y = _law(f, law)
    x = f.matrix()
    free = np.linalg.lstsq(x, y, rcond=None)[0]
    assert free[2] < 0  # unconstrained least squares would give a negative cost
    keep = [0, 1, 3]
    for objective, w in (("absolute", np.ones(len(y))), ("relative", 1.0 / y)):
        got = fit_time(f, y, kinds, objective=objective)
        assert got["time_per_sequence"] == 0.0 and got["terms_at_zero"] == ["time_per_sequence"]
        refit = np.linalg.lstsq(x[:, keep] * w[:, None], y * w, rcond=None)[0]
        assert [got[TERMS[i]] for i in keep] == pytest.approx(refit.tolist(), rel=1e-9)
        assert got["objective"] == objective


def test_the_relative_objective_weighs_each_row_by_its_time() -> None:
    """Squares of the relative error: a small row off by 20 % counts as much as a large one."""
    f, kinds = _rows(30)
    y = _law(f, TRUE) * np.where(np.arange(30) % 5 == 0, 1.2, 1.0)
    rel, ab = fit_time(f, y, kinds), fit_time(f, y, kinds, objective="absolute")
    x = f.matrix()
    want = nnls(x / y[:, None], np.ones(30))
    assert [rel[t] for t in TERMS] == pytest.approx(want.tolist(), rel=1e-9)
    assert [ab[t] for t in TERMS] == pytest.approx(nnls(x, y).tolist(), rel=1e-9)
    line = nnls(np.column_stack([f.linear + f.attention, np.ones(30)]) / y[:, None], np.ones(30))
    assert [rel["flops_line"]["time_per_flop"], rel["flops_line"]["time_fixed"]] == pytest.approx(
        line.tolist(), rel=1e-9
    )

    def rel_squares(g: dict) -> float:  # type: ignore[type-arg]
        return float((((predict(g, f) - y) / y) ** 2).sum())

    assert rel_squares(rel) <= rel_squares(ab)


def _kkt(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> None:
    """Optimality of NNLS: no coefficient < 0, zero gradient on the positive ones, and a
    gradient that points outwards (would lower no residual) on the zero ones."""
    scale = np.abs(x).max(axis=0)
    g = (x / scale).T @ (y - x @ coef) / np.abs(y).max()
    assert (coef >= 0).all()
    assert np.abs(g[coef > 0]).max(initial=0) < 1e-8
    assert (g[coef == 0] < 1e-8).all()


@pytest.mark.parametrize("seed", range(12))
def test_nnls_is_optimal_on_random_problems(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 5))
    scale = np.array([1e12, 1e10, 30, 1])[:k]
    x = rng.random((20, k)) * scale
    y = x @ (rng.normal(0, 1, k) / scale) + rng.normal(0, 0.1, 20)
    coef = nnls(x, y)
    _kkt(x, y, coef)
    for signs in product([0, 1], repeat=k):  # no feasible point on any support does better
        cols = [i for i in range(k) if signs[i]]
        if cols:
            c = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
            if (c >= 0).all():
                r = y - x[:, cols] @ c
                assert r @ r >= (y - x @ coef) @ (y - x @ coef) * (1 - 1e-9)


def test_single_sample_rows_give_the_micro_batch_term_not_a_split() -> None:
    """Every row one sample: sequences and the micro-batch term are the same column."""
    lens = np.array([256, 512, 1024, 2048, 4096, 768, 1536, 3072])
    f = micro_features(lens, np.arange(len(lens) + 1), None, SPEC)
    got = fit_time(f, _law(f, dict(TRUE, time_per_sequence=0.0)))
    assert got["time_per_sequence"] == 0.0
    assert got["time_per_micro_batch"] == pytest.approx(TRUE["time_per_micro_batch"], rel=1e-9)


def test_the_held_out_rows_are_every_kth_and_not_fitted() -> None:
    assert holdout_mask(10, 4).tolist() == [i in (3, 7) for i in range(10)]
    assert not holdout_mask(5, 0).any()
    f, kinds = _rows(30)
    y = _law(f, TRUE)
    base = fit_time(f, y, kinds, holdout=3)
    assert (base["rows"], base["held_out"]) == (20, 10)
    spoiled = y.copy()
    spoiled[2::3] *= 2.0  # only held-out rows change: the fit does not move, their error does
    got = fit_time(f, spoiled, kinds, holdout=3, objective="absolute")
    assert [got[t] for t in TERMS] == pytest.approx([base[t] for t in TERMS], rel=1e-9)
    assert got["time_error_held_out"]["mean_pct"] == pytest.approx(50.0)
    assert got["time_error"]["max_pct"] < 1e-7
    line = fit_line(f.linear[~holdout_mask(30, 3)] + f.attention[~holdout_mask(30, 3)],
                    y[~holdout_mask(30, 3)], "step time")  # fmt: skip
    assert got["flops_line"]["time_per_flop"] == pytest.approx(line[0])
    assert got["flops_line"]["time_fixed"] == pytest.approx(line[1])


def test_errors_per_kind() -> None:
    f, kinds = _rows(30)
    y = _law(f, TRUE)
    y[kinds == "chat"] *= 1.1  # measured 10 % slower than the law, chat rows only
    got = fit_time(f, y, kinds, holdout=2)
    by = got["time_error_held_out_by_kind"]
    assert list(by) == ["chat", "rollout", "single"]  # in the order the rows name them
    assert sum(v["rows"] for v in by.values()) == got["held_out"]
    assert by["chat"]["rows"] == int(((kinds == "chat") & holdout_mask(30, 2)).sum())
    assert set(got["time_error_by_kind"]) == set(by)
    assert set(got["flops_line"]["time_error_held_out_by_kind"]) == set(by)
    worst = max(by, key=lambda k: by[k]["mean_pct"])
    assert worst == "chat"
    assert list(fit_time(f, y)["time_error_by_kind"]) == ["all"]  # no labels: one kind


def test_features_count_padding_as_linear_work() -> None:
    lens = np.array([100, 200, 50, 7])
    f = micro_features(lens, np.array([0, 2, 2, 4]), np.array([320, 0, 64]), SPEC)
    per_token = 3.0 * linear_per_token(SPEC)
    assert f.linear.tolist() == [320 * per_token, 0.0, 64 * per_token]  # padding included
    att = train_flops(lens, SPEC).attention
    assert f.attention.tolist() == pytest.approx([att[0] + att[1], 0.0, att[2] + att[3]])
    assert f.sequences.tolist() == [2.0, 0.0, 2.0]
    padded = micro_features(lens, np.array([0, 2, 4]), np.array([200, 64]), SPEC, "padded")
    assert padded.linear.tolist() == [2 * 200 * per_token, 2 * 64 * per_token]
    assert padded.attention[0] == pytest.approx(2 * train_flops(np.array([200]), SPEC).attention[0])
    unpadded = micro_features(lens, np.array([0, 2, 4]), None, SPEC)
    assert unpadded.linear.tolist() == [300 * per_token, 57 * per_token]


REFUSED = [
    (lambda f, y: fit_time(f, y, holdout=2), "leaves 2 of 4 rows to fit 4 coefficients"),
    (lambda f, y: fit_time(f, y, holdout=-1), "holdout -1"),
    (lambda f, y: fit_time(f, y, holdout=True), "holdout True"),
    (lambda f, y: fit_time(f, y, objective="l1"), "objective 'l1'; choose relative or absolute"),
    (lambda f, y: fit_time(f, np.full(4, 0.5)), "does not grow with the FLOPs"),
    (lambda f, y: fit_time(f, y[::-1].copy()), "does not grow with the FLOPs"),
    (lambda f, y: fit_time(f, y * 1e40), "beyond what a plan accepts"),
    (lambda f, y: fit_time(f, np.r_[y[:3], np.nan]), "row 3 has seconds nan"),
    (lambda f, y: fit_time(f, np.r_[y[:3], 0.0]), "must be finite and > 0"),
    (lambda f, y: fit_time(f, y[:3]), "linear has shape (4,); give one value per row (3)"),
    (lambda f, y: fit_time(f, y, kinds=["a"]), "kinds has 1 labels for 4 rows"),
    (lambda f, y: fit_time(f, ["x"] * 4), "seconds must be numbers"),
    (lambda f, y: fit_time(f[:2], y), "features must be (linear, attention, sequences)"),
    (lambda f, y: fit_time(Features(f.linear * 0 + 1, f.attention * 0, f.sequences), y),
     "at least two different FLOPs"),
]  # fmt: skip


@pytest.mark.parametrize("call,message", REFUSED)
def test_refusals_in_one_line(call, message) -> None:  # type: ignore[no-untyped-def]
    lens = np.array([256, 1024, 2048, 4096])
    f = micro_features(lens, np.arange(5), None, SPEC)
    y = _law(f, TRUE)
    with pytest.raises(InputError) as err:
        call(f, y)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args,message",
    [
        ((np.array([1, 2]), np.array([0, 1]), None), "offsets must run from 0 to len(lens)"),
        ((np.array([1, 2]), np.array([0, 2, 1]), None), "offsets must run from 0"),
        ((np.array([1, 2]), np.array([0, 1, 2]), np.array([64])), "pad_to has 1 values for 2"),
        ((np.array([5, 2]), np.array([0, 2]), np.array([4])), "holds 7 tokens in a row of 4"),
        ((np.array([-1, 2]), np.array([0, 2]), None), "lens must be >= 0"),
    ],
)
def test_feature_refusals(args, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(VarpackError) as err:
        lens, offsets, pad_to = args
        micro_features(lens, offsets, pad_to, SPEC)
    assert message in str(err.value)
    with pytest.raises(InputError, match="layout 'blocks'"):
        micro_features(np.array([1]), np.array([0, 1]), None, SPEC, "blocks")
