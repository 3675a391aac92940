"""Mixtures: sources drawn at chosen weights, repeated or subsampled, interleaved at their weights.

``--mix code=0.3,chat=0.5,math=0.2`` (with ``--source-column``) makes the run's samples a blend:
each source gets its weight's share of the run's total (tokens by default, or samples), and the
sources are interleaved so that every stretch of the stream holds them at their weights. Pure
NumPy; the I/O edge reads the source of each sample (:mod:`varpack.make.mixing`).

**Repeat or subsample** (:func:`draw`): a source of ``n`` samples whose share is ``k`` whole
passes and a fraction more gets ``k`` copies of every sample, then a prefix of a permutation
drawn from ``(seed, source)`` for the rest: no sample is used ``k + 1`` times before every
sample of its source has been used ``k`` times. By tokens, the prefix ends at the first sample
that reaches the share; by samples, it holds exactly the share's count (rounded).

**Interleave** (:func:`interleave`): each source's stream (shuffled from ``(seed, source)``,
or sorted by length for a curriculum) is given a *virtual time*: the share of the source's tokens
(or samples) up to the middle of each sample. All sources merged by virtual time advance at the
same rate, so any prefix of the merged stream holds each source at its weight, within one sample.

**Documents in pieces** (``--oversize split``): the blend draws documents (a subsample draws
whole documents, a document drawn twice brings all its pieces twice), and interleaves their
pieces, each piece with its document's source (:mod:`varpack.make.mixing`).

**Tolerance** (:data:`SHARE_TOLERANCE`, ``--mix-tolerance``): how far a step's token share of a
source may be from its target. It is a promise the figures measure, never widened to what small
steps can hold: :func:`held_figures` counts the steps within it and the distance 95 % of the
steps are within, which is what steps of this size can hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from varpack.errors import ConfigError

#: how far weights may sum from 1
WEIGHT_TOLERANCE = 1e-6
#: how far a step's token share of a source may be from its target by default (2 points),
#: whatever the size of the steps: steps too small to hold it are counted, not excused
SHARE_TOLERANCE = 0.02
#: the share of the steps whose largest distance from the targets :func:`held_figures` reports
#: as what the steps can hold
HELD_QUANTILE = 0.95
#: the blend being planned: each input sample's source code, each code's weight, the tolerance
_BLEND: ContextVar[tuple[np.ndarray, np.ndarray, float] | None] = ContextVar("blend", default=None)


@contextmanager
def blending(codes: np.ndarray, weights: np.ndarray, tolerance: float) -> Iterator[None]:
    """Inside the block, the planner composes shuffled steps keeping each source's weight
    (``codes``: each of the planner's input samples' source; ``weights[code]``) within
    ``tolerance``: the cost composer deals a sample to the step that holds least of its source
    against its share (:func:`varpack.plan.kernels.window.compose_window`), then swaps
    like-sized samples between steps (:mod:`varpack.plan.kernels.shares`)."""
    blend = (np.asarray(codes, np.int64), np.asarray(weights, np.float64), float(tolerance))
    token = _BLEND.set(blend)
    try:
        yield
    finally:
        _BLEND.reset(token)


def blend_sources() -> tuple[np.ndarray, np.ndarray, float] | None:
    """The blend being planned (:func:`blending`), if any."""
    return _BLEND.get()


@dataclass(frozen=True)
class Mix:
    """Weights by source name, the unit they are in, the run's total (``None``: the largest
    that repeats no source), and how far each step's shares may be from the weights."""

    weights: dict[str, float]
    unit: str = "tokens"
    total: int | None = None
    tolerance: float | None = None  # None: SHARE_TOLERANCE


def parse_mix(text: str) -> dict[str, float]:
    """``"code=0.3,chat=0.7"`` as ``{name: weight}``; one line for what is wrong.

    >>> parse_mix("code=0.3, chat=0.7")
    {'code': 0.3, 'chat': 0.7}
    """
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, value = part.partition("=")
        name = name.strip()
        try:
            weight = float(value) if eq else float("nan")
        except ValueError:
            weight = float("nan")
        if not name or not np.isfinite(weight) or weight <= 0:
            raise ConfigError(
                f"--mix {text!r}: {part!r} is not NAME=WEIGHT with a weight > 0 "
                "(--mix code=0.3,chat=0.7)"
            )
        if name in out:
            raise ConfigError(f"--mix {text!r}: source {name!r} named twice")
        out[name] = weight
    total = sum(out.values())
    if not out or abs(total - 1) > WEIGHT_TOLERANCE:
        raise ConfigError(
            f"--mix {text!r}: the weights sum to {total:g}, not 1 "
            f"({', '.join(f'{k}={v:g}' for k, v in out.items())})"
        )
    return out


def default_total(sizes: dict[str, int], weights: dict[str, float]) -> int:
    """The largest total in which no source is repeated: ``min(size / weight)``.

    >>> default_total({"a": 100, "b": 50}, {"a": 0.5, "b": 0.5})
    100
    """
    return int(min(sizes[s] / w for s, w in weights.items()))


def draw(lens: np.ndarray, share: int, by_tokens: bool, rng: np.random.Generator) -> np.ndarray:
    """Positions into one source's samples (``lens``) making up ``share`` tokens or samples:
    whole passes, then a prefix of a seeded permutation (see the module doc).

    >>> draw(np.array([5, 5, 5, 5]), 6, False, np.random.default_rng(0)).size
    6
    >>> np.bincount(draw(np.array([5, 5, 5, 5]), 6, False, np.random.default_rng(0))).tolist()
    [2, 1, 2, 1]
    """
    n = len(lens)
    size = int(lens.sum()) if by_tokens else n
    passes, rest = divmod(int(share), size)
    whole = np.tile(np.arange(n, dtype=np.int64), passes)
    if rest == 0:
        return whole
    perm = rng.permutation(n).astype(np.int64)
    if by_tokens:
        cut = int(np.searchsorted(np.cumsum(lens[perm]), rest)) + 1  # the sample reaching it
    else:
        cut = rest
    return np.concatenate((whole, perm[: min(cut, n)]))


def copy_number(units: np.ndarray) -> np.ndarray:
    """Which use of its sample each unit is (0 for the first), in the units' order.

    >>> copy_number(np.array([4, 2, 4, 4, 2])).tolist()
    [0, 0, 1, 2, 1]
    """
    order = np.argsort(units, kind="stable")
    s = units[order]
    start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    run = np.repeat(start, np.diff(np.r_[start, len(s)]))
    out = np.empty(len(units), dtype=np.int64)
    out[order] = np.arange(len(s)) - run
    return out


def interleave(
    source: np.ndarray,
    lens: np.ndarray,
    copy: np.ndarray,
    by_tokens: bool,
    seed: int,
    curriculum: bool,
    samples: np.ndarray | None = None,
) -> np.ndarray:
    """The order of the units (``source`` code, length and :func:`copy_number` of each) in the
    merged stream: each source's units shuffled from ``(seed, source)``, or for a curriculum
    sorted by length within each pass over the source (a repeated sample's copies are a pass
    apart), then all merged by virtual time (module doc). By samples, a unit counts
    ``samples[i]`` of one (a piece: one over its document's pieces; default 1)."""
    if len(source) == 0:
        return np.zeros(0, dtype=np.int64)
    streams, vtimes = [], []
    for s in np.unique(source):
        mine = np.flatnonzero(source == s)
        if curriculum:
            mine = mine[np.lexsort((lens[mine], copy[mine]))]
        else:
            mine = mine[np.random.default_rng([seed, 1 << 20, int(s)]).permutation(len(mine))]
        if by_tokens:
            size = lens[mine].astype(np.float64)
        else:
            size = np.ones(len(mine)) if samples is None else samples[mine].astype(np.float64)
        done = np.cumsum(size) - size / 2  # up to the middle of each unit
        streams.append(mine)
        vtimes.append(done / size.sum())
    # one stable sort: a source's units keep their order, ties between sources go by source
    stream = np.concatenate(streams)
    return stream[np.argsort(np.concatenate(vtimes), kind="stable")]


def source_sizes(
    codes: np.ndarray, lens: np.ndarray, names: list[str], mix: Mix
) -> tuple[dict[str, int], int, dict[str, int]]:
    """Each source's size (tokens or samples), the run's total and each weighed source's share
    of it, in the mix's unit; one line for a source without samples or a total too small to give
    every weighed source a share (``codes[i]``: sample ``i``'s source, an index into ``names``).

    >>> source_sizes(np.array([0, 1, 1]), np.array([4, 2, 2]), ["a", "b"], Mix({"a": 0.5, "b": 0.5}))
    ({'a': 4, 'b': 4}, 8, {'a': 4, 'b': 4})
    """
    by_tokens = mix.unit == "tokens"
    count = np.bincount(codes, weights=lens if by_tokens else None, minlength=len(names))
    sizes = {name: int(round(float(count[k]))) for k, name in enumerate(names)}
    missing = [s for s in mix.weights if sizes.get(s, 0) == 0]
    if missing:
        have = ", ".join(f"{n} ({sizes[n]:,} {mix.unit})" for n in names) or "none"
        raise ConfigError(
            f"--mix: source {missing[0]!r} has no samples (sources: {have}); weigh only sources "
            "the data holds"
        )
    total = mix.total if mix.total is not None else default_total(sizes, mix.weights)
    shares = {name: int(round(w * total)) for name, w in mix.weights.items()}
    empty = [s for s, v in shares.items() if v == 0]
    if empty:
        least = min(mix.weights.values())
        given = f"--total-{mix.unit} {total:,}" if mix.total is not None else f"--mix: {total:,}"
        raise ConfigError(
            f"{given}: source {empty[0]!r} (weight "
            f"{mix.weights[empty[0]]:g}) would get no {mix.unit}; give a total of at least "
            f"{int(np.ceil(1 / least)):,} (the default, {default_total(sizes, mix.weights):,}, "
            "repeats no source)"
        )
    return sizes, total, shares


def blend_rows(
    codes: np.ndarray, lens: np.ndarray, units: np.ndarray | None, names: list[str], mix: Mix
) -> int:
    """About how many rows (units: pieces of split documents count one each) the blend of
    :func:`source_sizes` draws, before drawing: each source's units times its repeat factor,
    rounded up (``units[i]``: sample ``i``'s units; default one each).

    >>> blend_rows(np.array([0, 1, 1]), np.array([4, 2, 2]), None, ["a", "b"], Mix({"a": 0.5, "b": 0.5}, total=80))
    30
    """
    sizes, _, shares = source_sizes(codes, lens, names, mix)
    per = np.bincount(codes, weights=units, minlength=len(names))
    return sum(int(np.ceil(shares[s] / sizes[s] * float(per[names.index(s)]))) for s in mix.weights)


def mix_units(
    codes: np.ndarray, lens: np.ndarray, names: list[str], mix: Mix, seed: int
) -> tuple[np.ndarray, dict[str, dict[str, float]]]:
    """Positions into the samples (with repeats) that make the run, and each source's figures.

    ``codes[i]`` is sample ``i``'s source, an index into ``names``; ``lens`` its length."""
    by_tokens = mix.unit == "tokens"
    sizes, _, shares = source_sizes(codes, lens, names, mix)
    picks, figures = [], {}
    for name, weight in mix.weights.items():
        k = names.index(name)
        mine = np.flatnonzero(codes == k)
        rng = np.random.default_rng([seed, 1 << 21, k])
        got = mine[draw(lens[mine], shares[name], by_tokens, rng)]
        picks.append(got)
        figures[name] = {
            "weight": weight,
            "samples": int(len(mine)),
            "tokens": int(lens[mine].sum()),
            "planned_samples": int(len(got)),
            "planned_tokens": int(lens[got].sum()),
            "repeat": (int(lens[got].sum()) if by_tokens else len(got)) / sizes[name],
        }
    return np.concatenate(picks), figures


def step_shares(
    sample_step: np.ndarray, code: np.ndarray, size: np.ndarray, sources: int, steps: int
) -> np.ndarray:
    """``[source, step]``: each source's share of every step (``code``: each planned sample's
    source, -1 for none; ``size``: its tokens, or 1 by samples).

    >>> step_shares(np.array([0, 0, 1]), np.array([0, 1, 1]), np.ones(3), 2, 2).tolist()
    [[0.5, 0.0], [0.5, 1.0]]
    """
    total = np.maximum(np.bincount(sample_step, weights=size, minlength=steps), 1e-300)
    keep = code >= 0
    flat = code[keep] * steps + sample_step[keep]
    tok = np.bincount(flat, weights=size[keep], minlength=sources * steps)
    return tok.reshape(sources, steps) / total


def measured_shares(
    sample_step: np.ndarray, code: np.ndarray, tokens: np.ndarray, codes: list[int]
) -> np.ndarray:
    """``[source, step]``: the token share of source ``codes[i]`` (a code in ``code``, each
    planned sample's) in every step, the run's last step left out (it holds what is left)."""
    steps = int(sample_step.max()) + 1 if len(sample_step) else 0
    top = max(max(codes, default=0), int(code.max()) if len(code) else 0)
    remap = np.full(top + 2, -1, dtype=np.int64)  # index -1 (no source) stays -1
    remap[np.asarray(codes, dtype=np.int64)] = np.arange(len(codes))
    shares = step_shares(sample_step, remap[code], tokens, len(codes), steps)
    return shares[:, : max(steps - 1, 1)]


def share_figures(
    shares: np.ndarray, names: list[str], targets: list[float], tolerance: float
) -> dict[str, dict[str, float]]:
    """Each source's share of the steps (``shares``: :func:`measured_shares`): mean, min and max
    over the steps, the distance from its target (its share of the blend's tokens; ``error``:
    mean, and ``error_max``), ``held``, the share of the steps within ``tolerance`` of the
    target, and ``outside``, how many are not.

    >>> s = measured_shares(np.array([0, 0, 1, 1, 2]), np.array([0, 1, 0, 0, 1]), np.ones(5), [0, 1])
    >>> share_figures(s, ["a", "b"], [0.5, 0.5], 0.02)["a"]
    {'mean': 0.75, 'min': 0.5, 'max': 1.0, 'error': 0.25, 'error_max': 0.5, 'held': 0.5, 'outside': 1}
    """
    out = {}
    for frac, name, w in zip(shares, names, targets, strict=True):
        error = np.abs(frac - w)
        within = error <= tolerance + 1e-9
        out[name] = {
            "mean": float(frac.mean()),
            "min": float(frac.min()),
            "max": float(frac.max()),
            "error": float(error.mean()),
            "error_max": float(error.max()),
            "held": float(within.mean()),
            "outside": int((~within).sum()),
        }
    return out


def held_figures(shares: np.ndarray, targets: list[float], tolerance: float) -> dict[str, float]:
    """How well the steps hold every source at once (``shares``: :func:`measured_shares`):
    ``steps`` measured, ``within``: how many hold every source within ``tolerance`` of its
    target, ``p95``: the distance from the targets that :data:`HELD_QUANTILE` of the steps are
    within (what steps of this size can hold), and ``max``, the furthest step's.

    >>> s = np.array([[0.5, 0.52, 0.6, 0.5], [0.5, 0.48, 0.4, 0.5]])
    >>> held_figures(s, [0.5, 0.5], 0.02)
    {'steps': 4, 'within': 3, 'p95': 0.1, 'max': 0.1}
    """
    worst = np.abs(shares - np.asarray(targets, dtype=np.float64)[:, None]).max(axis=0)
    rank = max(int(np.ceil(HELD_QUANTILE * len(worst))) - 1, 0)
    return {
        "steps": int(len(worst)),
        "within": int((worst <= tolerance + 1e-9).sum()),
        "p95": round(float(np.sort(worst)[rank]), 6) if len(worst) else 0.0,
        "max": round(float(worst.max()), 6) if len(worst) else 0.0,
    }
