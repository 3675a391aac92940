"""Fit the time model with the terms a GPU step has, from measured micro-batches.

A micro-batch's seconds are modelled as

    seconds = a_lin * linear + a_attn * attention + c * sequences + b

* ``linear``: the matmul FLOPs of its row (the samples' linear FLOPs plus, for the pad tokens of a
  packed row, the linear FLOPs per token: what ``--cost flops`` counts for padding);
* ``attention``: the causal attention FLOPs of its samples, each alone (block-diagonal);
* ``sequences``: the samples in it (per-sequence work of varlen kernels);
* ``1``: the micro-batch itself (launches, synchronisation).

Each row's features come from :func:`micro_features` (a plan's micro-batches and a
:class:`~varpack.plan.models.ModelSpec`) or are given. :func:`fit_time` fits the four
coefficients by non-negative least squares (:func:`nnls`): a term the rows cannot pay for is
clamped to 0 and the others refitted. It holds every k-th row out (as
:func:`varpack.plan.calibrate.calibrate` does) and reports the error of the prediction on those
rows, overall and per kind of micro-batch, next to the same figures for ``a * flops + b`` (the
model ``--cost time`` had) fitted on the same rows in the same way.

The squares are of the relative error by default (``objective="relative"``: each row weighted by
``1 / seconds``): measured micro-batches span fifty-fold in time, plain squares let the largest
rows set every coefficient, and the fixed terms (``c``, ``b``) show in the smallest rows; the
relative error is also what the held-out figure reports. ``objective="absolute"`` gives plain
least squares (``a * flops + b`` is then exactly :func:`varpack.plan.calibrate.fit_line`, what
``varpack calibrate`` fits).

Refusals (:class:`~varpack.errors.InputError`): too few rows to fit, rows whose time does not grow
with the FLOPs, or coefficients a plan would refuse (beyond
:data:`~varpack.plan.context.LARGEST`: the units are wrong).

Why a solver of its own: scipy is not a dependency. With at most four columns the exact NNLS is
tiny: the optimum is the least-squares solution on its own support (the columns whose
coefficient is positive), so solving least squares on each of the ``2^k - 1`` subsets of
linearly independent columns and keeping the best one with no negative coefficient is exact (15
solves of at most 4 columns).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, NamedTuple

import numpy as np

from varpack.errors import InputError
from varpack.plan.calibrate import fit_line
from varpack.plan.context import LARGEST
from varpack.plan.models.flops import TRAIN_PASSES, linear_per_token, train_flops
from varpack.plan.models.spec import ModelSpec

#: the terms of the model, in the order of the coefficients (the JSON keys of :func:`fit_time`)
TERMS = ("time_per_linear_flop", "time_per_attention_flop", "time_per_sequence",
         "time_per_micro_batch")  # fmt: skip
#: the order in which :func:`nnls` tries the subsets of one size; the first of equal residual
#: stays (collinear columns: the micro-batch term before the per-sequence one)
_PREFERENCE = (0, 1, 3, 2)
MAX_COLUMNS = 4  # 2^k subsets: the enumeration is for small k only
OBJECTIVES = ("relative", "absolute")


class Features(NamedTuple):
    """The fit's columns for each micro-batch (float64 arrays, one value per micro-batch)."""

    linear: np.ndarray
    attention: np.ndarray
    sequences: np.ndarray

    def matrix(self) -> np.ndarray:
        """``[linear, attention, sequences, 1]`` per row, in the order of :data:`TERMS`."""
        return np.column_stack([self.linear, self.attention, self.sequences,
                                np.ones(len(self.linear))])  # fmt: skip


def micro_features(
    lens: np.ndarray,
    offsets: np.ndarray,
    pad_to: np.ndarray | None,
    spec: ModelSpec,
    layout: str = "packed",
    passes: int = TRAIN_PASSES,
) -> Features:
    """Features of micro-batch ``i`` holding ``lens[offsets[i]:offsets[i+1]]`` in rows of
    ``pad_to[i]`` tokens (None: no padding), training FLOPs (``passes`` forwards).

    Packed: one row of ``pad_to`` tokens, linear FLOPs over all of them, attention per sample.
    Padded: each sample in its own row of ``pad_to``, costed as a sample of that length (as
    ``--cost flops`` does).

    >>> spec = ModelSpec("llama", 8, 1, 2, 1, 4, 16, True, 10, (None,))
    >>> f = micro_features(np.array([2, 3, 4]), np.array([0, 2, 3]), np.array([8, 4]), spec)
    >>> (f.linear / (3 * linear_per_token(spec))).tolist(), f.sequences.tolist()
    ([8.0, 4.0], [2.0, 1.0])
    """
    lens = np.asarray(lens, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(lens):
        raise InputError(
            f"micro_features: offsets must run from 0 to len(lens) ({len(lens)}), one more "
            "than there are micro-batches"
        )
    count = np.diff(offsets)
    if (count < 0).any() or (lens < 0).any():
        raise InputError("micro_features: offsets must not decrease and lens must be >= 0")
    tokens = _segment_sums(lens.astype(np.float64), offsets)
    rows = tokens if pad_to is None else np.asarray(pad_to, dtype=np.float64)
    if rows.shape != tokens.shape:
        raise InputError(
            f"micro_features: pad_to has {rows.size} values for {len(count)} micro-batches"
        )
    if layout not in ("packed", "padded"):
        raise InputError(f"micro_features: layout {layout!r}; choose packed or padded")
    per_token = float(passes * linear_per_token(spec))
    if layout == "padded":
        att = train_flops(rows, spec, passes).attention
        return Features(count * rows * per_token, count * att, count.astype(np.float64))
    if (rows < tokens).any():
        i = int(np.flatnonzero(rows < tokens)[0])
        raise InputError(
            f"micro_features: micro-batch {i} holds {int(tokens[i])} tokens in a row of "
            f"{int(rows[i])}; pad_to must be at least its tokens"
        )
    att = _segment_sums(train_flops(lens, spec, passes).attention, offsets)
    return Features(rows * per_token, att, count.astype(np.float64))


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    count = np.diff(offsets)
    out = np.zeros(len(count), dtype=np.float64)
    full = count > 0
    if full.any():  # reduceat over the starts of the non-empty segments: each runs to the next
        out[full] = np.add.reduceat(values, offsets[:-1][full])
    return out


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The exact non-negative least-squares solution of ``x @ coef ~ y`` (at most 4 columns).

    Columns are scaled to a largest value of 1 before solving (FLOPs of 1e12 beside counts of 1).
    Subsets of linearly dependent columns are skipped, and a larger subset replaces a smaller
    one only when it lowers the residual (beyond rounding): a term that explains nothing is 0,
    and a collinear pair (the sequences and the micro-batch term when every row holds one
    sample) gives one coefficient, the micro-batch's, not an arbitrary split.

    >>> x = np.array([[1.0, 1], [2, 1], [3, 1]])
    >>> nnls(x, np.array([3.0, 5, 7])).round(9).tolist()  # y = 2 x + 1
    [2.0, 1.0]
    >>> nnls(x, np.array([1.0, 0, -1])).round(9).tolist()  # the slope would be negative
    [0.0, 0.0]
    """
    n, k = x.shape
    assert 1 <= k <= MAX_COLUMNS
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    ys_scale = float(np.abs(y).max()) or 1.0
    ys = y / ys_scale
    best, best_res = np.zeros(k), float(ys @ ys)  # the empty support
    order = [_PREFERENCE[i] for i in range(MAX_COLUMNS) if _PREFERENCE[i] < k]
    tol = 1e-20 * max(best_res, 1e-300)  # rounding, not a better fit
    for size in range(1, k + 1):  # smaller supports first: a term that lowers no residual is 0
        for cols in combinations(order, size):
            sub = xs[:, list(cols)]
            if np.linalg.matrix_rank(sub) < size:
                continue
            coef = np.linalg.lstsq(sub, ys, rcond=None)[0]
            if (coef < 0).any():
                continue
            r = ys - sub @ coef
            res = float(r @ r)
            if res < best_res - tol:
                best, best_res = np.zeros(k), res
                best[list(cols)] = coef
    return best / scale * ys_scale


def _errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Relative error in percent, mean and max (empty without rows)."""
    if not len(y):
        return {}
    with np.errstate(all="ignore"):
        rel = np.abs(pred - y) / np.abs(y) * 100.0
    return {"rows": len(y), "mean_pct": float(rel.mean()), "max_pct": float(rel.max())}


def _by_kind(
    pred: np.ndarray, y: np.ndarray, kinds: np.ndarray, rows: np.ndarray
) -> dict[str, Any]:
    names = list(dict.fromkeys(kinds.tolist()))  # in the order the rows first name them
    return {str(k): _errors(pred[rows & (kinds == k)], y[rows & (kinds == k)]) for k in names}


def holdout_mask(n: int, holdout: int) -> np.ndarray:
    """Rows kept out of the fit: every ``holdout``-th (rows ``holdout-1``, ``2*holdout-1``, ...),
    none for 0, as ``varpack calibrate --holdout`` keeps them.

    >>> holdout_mask(7, 3).tolist()
    [False, False, True, False, False, True, False]
    """
    test = np.zeros(n, bool)
    if holdout:
        test[holdout - 1 :: holdout] = True
    return test


def _floats(name: str, values: Any) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"fit_time: {name} must be numbers, one per row") from None


def _check(features: Features, seconds: np.ndarray, kinds: Any, holdout: int) -> np.ndarray:
    n = len(seconds)
    cols = {"linear": features.linear, "attention": features.attention,
            "sequences": features.sequences, "seconds": seconds}  # fmt: skip
    for name, v in cols.items():
        if np.shape(v) != (n,):
            raise InputError(
                f"fit_time: {name} has shape {np.shape(v)}; give one value per row ({n})"
            )
        bad = ~np.isfinite(v) | (v < 0)
        if name == "seconds":
            bad |= v == 0
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            need = "> 0" if name == "seconds" else ">= 0"
            raise InputError(
                f"fit_time: row {i} has {name} {float(v[i])!r}; must be finite and {need}"
            )
    if kinds is not None and len(kinds) != n:
        raise InputError(f"fit_time: kinds has {len(kinds)} labels for {n} rows")
    if isinstance(holdout, bool) or not isinstance(holdout, int | np.integer) or holdout < 0:
        raise InputError(f"fit_time: holdout {holdout!r}; give a whole number >= 0 (0: none)")
    fit = ~holdout_mask(n, int(holdout))
    if fit.sum() < len(TERMS):
        raise InputError(
            f"fit_time: holdout {holdout} leaves {int(fit.sum())} of {n} rows to fit "
            f"{len(TERMS)} coefficients; measure more micro-batches or hold out fewer (0: none)"
        )
    return fit


def fit_time(
    features: Features,
    seconds: Any,
    kinds: Any = None,
    holdout: int = 0,
    objective: str = "relative",
) -> dict[str, Any]:
    """The four coefficients (keys :data:`TERMS`), the terms clamped to 0, the errors on the fit
    rows and on the held-out rows (overall and per kind), and ``a * flops + b`` fitted on the
    same rows with its errors (key ``flops_line``).

    ``kinds``: a label per row (e.g. ``"chat rows"``); the per-kind errors name each label.
    ``objective``: ``relative`` (squares of the relative error) or ``absolute`` (of seconds).
    """
    if objective not in OBJECTIVES:
        raise InputError(f"fit_time: objective {objective!r}; choose {' or '.join(OBJECTIVES)}")
    if not isinstance(features, tuple) or len(features) != len(Features._fields):
        raise InputError("fit_time: features must be (linear, attention, sequences), a Features")
    seconds = _floats("seconds", seconds)
    features = Features(*(_floats(n, c) for n, c in zip(Features._fields, features, strict=True)))
    fit = _check(features, seconds, kinds, holdout)
    test = ~fit
    label = np.full(len(seconds), "all") if kinds is None else np.asarray(kinds, dtype=str)
    flops = features.linear + features.attention
    if np.ptp(flops[fit]) == 0:
        raise InputError("fit_time: the fit needs rows with at least two different FLOPs")
    x = features.matrix()
    w = 1.0 / seconds if objective == "relative" else np.ones(len(seconds))
    with np.errstate(all="ignore"):
        coef = nnls(x[fit] * w[fit, None], seconds[fit] * w[fit])
    if not (coef[0] > 0 or coef[1] > 0):
        raise InputError(
            "fit_time: the step time does not grow with the FLOPs (both slopes fit to 0); "
            "measure micro-batches of clearly different sizes"
        )
    if not (np.isfinite(coef).all() and coef.max() <= LARGEST):
        raise InputError(
            f"fit_time: the fit gives {', '.join(f'{c:.3g}' for c in coef)}, beyond what a plan "
            f"accepts ({LARGEST:g}); give the time in seconds and the FLOPs as counted"
        )
    pred = x @ coef
    out: dict[str, Any] = {"rows": int(fit.sum()), "held_out": int(test.sum()),
                           "objective": objective}  # fmt: skip
    out.update({t: float(c) for t, c in zip(TERMS, coef, strict=True)})
    out["terms_at_zero"] = [t for t, c in zip(TERMS, coef, strict=True) if c == 0]
    out.update(_report(pred, seconds, label, fit))
    try:  # the model --cost time had, on the same rows (a refusal is a result too)
        a, b = _line(flops[fit], seconds[fit], w[fit], objective)
    except InputError as exc:
        out["flops_line"] = {"refused": str(exc)}
    else:
        out["flops_line"] = {"time_per_flop": a, "time_fixed": b,
                             **_report(a * flops + b, seconds, label, fit)}  # fmt: skip
    return out


def _line(flops: np.ndarray, y: np.ndarray, w: np.ndarray, objective: str) -> tuple[float, float]:
    """``a * flops + b`` (both >= 0, a > 0) fitted as the four-term model is."""
    if objective == "absolute":
        return fit_line(flops, y, "step time")
    with np.errstate(all="ignore"):
        a, b = nnls(np.column_stack([flops, np.ones(len(y))]) * w[:, None], y * w)
    if not a > 0:
        raise InputError(f"fit_time: a * flops + b does not grow with the work (slope {a:.3g})")
    if not (a <= LARGEST and b <= LARGEST):
        raise InputError(f"fit_time: a * flops + b gives {a:.3g} + {b:.3g}, beyond {LARGEST:g}")
    return float(a), float(b)


def _report(pred: np.ndarray, y: np.ndarray, label: np.ndarray, fit: np.ndarray) -> dict[str, Any]:
    return {"time_error": _errors(pred[fit], y[fit]),
            "time_error_held_out": _errors(pred[~fit], y[~fit]),
            "time_error_by_kind": _by_kind(pred, y, label, fit),
            "time_error_held_out_by_kind": _by_kind(pred, y, label, ~fit)}  # fmt: skip


def predict(fitted: dict[str, Any], features: Features) -> np.ndarray:
    """Seconds of each micro-batch under a fit of :func:`fit_time` (or its JSON).

    >>> f = Features(np.array([2.0]), np.array([1.0]), np.array([3.0]))
    >>> predict(dict(zip(TERMS, [1.0, 10.0, 100.0, 1000.0])), f).tolist()
    [1312.0]
    """
    coef = np.array([float(fitted[t]) for t in TERMS])
    return np.asarray(Features(*features).matrix() @ coef, dtype=np.float64)
