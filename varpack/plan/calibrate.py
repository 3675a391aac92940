"""Fit the memory and time models from measured steps (what ``varpack calibrate`` computes).

Rows are measured training steps: the tokens of the (packed) micro-batch, the peak activation
memory in bytes, and the step time in seconds. Least squares gives

* memory: ``peak = A * tokens + B`` (Skrull's ``alpha S + beta``): ``--memory-per-token A
  --memory-fixed B``, and with a capacity the bucket size ``C = (capacity - B) // A``;
* time: ``seconds = a * flops + b`` with each row's FLOPs (given, or of one sequence of that many
  tokens under the model dimensions): ``--cost time --time-per-flop a --time-fixed b``.

A fit with a negative intercept is refitted through the origin (the options are >= 0); a
non-positive slope is an error (the rows do not grow with the work), and so is a coefficient a
plan would refuse (beyond :data:`~varpack.plan.context.LARGEST`: check the CSV's units); the
bucket size is at least one token and at most int32. ``holdout`` keeps every k-th row out of the
fit and reports the error of the prediction on those rows, the figure that says how far to trust
the model.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from varpack.errors import InputError
from varpack.plan.context import LARGEST


def fit_line(x: np.ndarray, y: np.ndarray, what: str) -> tuple[float, float]:
    """``(slope, intercept >= 0)`` of least squares ``y = slope * x + intercept``.

    >>> [round(v, 9) for v in fit_line(np.array([1.0, 2, 3]), np.array([12.0, 22, 32]), "m")]
    [10.0, 2.0]
    """
    if len(x) < 2 or np.ptp(x) == 0:
        raise InputError(f"calibrate: {what} needs rows with at least two different sizes")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fit gone wrong is judged below, not warned about
        slope, icpt = np.polyfit(x, y, 1)
        if icpt < 0:  # through the origin
            slope, icpt = float(np.dot(x, y) / np.dot(x, x)), 0.0
    if not slope > 0:
        raise InputError(
            f"calibrate: {what} does not grow with the work (fitted slope {slope:.3g}); "
            "measure steps of clearly different sizes"
        )
    if not (slope <= LARGEST and icpt <= LARGEST):  # inf and NaN fail too
        raise InputError(
            f"calibrate: the {what} fit gives {slope:.3g} per unit + {icpt:.3g}, beyond what a "
            f"plan accepts ({LARGEST:g}); give memory in bytes and time in seconds"
        )
    return float(slope), float(icpt)


def _errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    with np.errstate(all="ignore"):  # an overflow is refused by the JSON writer, by name
        rel = np.abs(pred - y) / np.where(y != 0, np.abs(y), 1.0) * 100.0
    return {"mean_pct": float(rel.mean()), "max_pct": float(rel.max())} if len(y) else {}


def calibrate(
    tokens: np.ndarray,
    peak: np.ndarray | None,
    seconds: np.ndarray | None,
    flops: np.ndarray | None,
    capacity: int | None = None,
    holdout: int = 0,
) -> dict[str, Any]:
    """The fitted options and their errors (on the fit rows, and on held-out rows)."""
    n = len(tokens)
    test = np.zeros(n, bool)
    if holdout:
        test[holdout - 1 :: holdout] = True
    fit = ~test
    if holdout and fit.sum() < 2:
        raise InputError(
            f"calibrate: --holdout {holdout} leaves {int(fit.sum())} of {n} rows to fit; "
            "measure more steps or hold out fewer (0: none)"
        )
    out: dict[str, Any] = {"rows": int(fit.sum()), "held_out": int(test.sum())}
    x = np.asarray(tokens, dtype=np.float64)
    if peak is not None:
        a, b = fit_line(x[fit], peak[fit], "peak memory")
        out.update(memory_per_token=a, memory_fixed=b)
        out["memory_error"] = _errors(a * x[fit] + b, peak[fit])
        out["memory_error_held_out"] = _errors(a * x[test] + b, peak[test])
        if capacity is not None:
            out["memory_capacity"] = capacity
            out["bucket_size"] = bucket_size(capacity, a, b)
    if seconds is not None:
        assert flops is not None
        a, b = fit_line(flops[fit], seconds[fit], "step time")
        out.update(time_per_flop=a, time_fixed=b)
        out["time_error"] = _errors(a * flops[fit] + b, seconds[fit])
        out["time_error_held_out"] = _errors(a * flops[test] + b, seconds[test])
    return out


def bucket_size(capacity: int, per_token: float, fixed: float) -> int:
    """Tokens a rank holds within ``capacity`` bytes: ``(capacity - fixed) / per_token``, at
    least one, and no more than a plan can hold (int32).

    >>> bucket_size(10_000, 2.0, 1_000.0)
    4500
    """
    room = (capacity - fixed) // per_token
    if room < 1:
        raise InputError(
            f"calibrate: --memory-capacity {capacity:,} bytes leaves no room for a token (the fit "
            f"gives {fixed:,.0f} bytes fixed + {per_token:,.4g} per token); give the bytes a rank "
            "may use for activations, e.g. 80e9 for an 80 GB GPU"
        )
    return int(min(room, np.iinfo(np.int32).max))
