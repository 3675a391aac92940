"""Length statistics and a terminal histogram for ``varpack check`` (pure; no I/O).

>>> s = summarize(np.array([1, 2, 3, 100]), files=1)
>>> s.count, s.tokens, s.min, s.max
(4, 106, 1, 100)
>>> [(b.lo, b.hi, b.count) for b in s.histogram]
[(1, 2, 1), (2, 4, 2), (4, 8, 0), (8, 16, 0), (16, 32, 0), (32, 64, 0), (64, 128, 1)]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
_BLOCK = 1 << 20


@dataclass(frozen=True)
class Bin:
    """Samples with ``lo <= seq_len < hi`` (``hi = 2 * lo``)."""

    lo: int
    hi: int
    count: int
    tokens: int


@dataclass(frozen=True)
class Summary:
    files: int
    count: int
    tokens: int
    min: int
    mean: float
    max: int
    percentiles: dict[str, int]
    histogram: list[Bin]
    keys: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (``varpack check --json``)."""
        return asdict(self)


def percentile_name(q: float) -> str:
    """``p50``, ``p99.9``.

    >>> percentile_name(99.9), percentile_name(50.0)
    ('p99.9', 'p50')
    """
    return f"p{q:g}"


def log2_histogram(lens: np.ndarray) -> list[Bin]:
    """Counts and tokens per power-of-two bin, from the smallest to the largest non-empty bin."""
    if len(lens) == 0:
        return []
    counts = np.zeros(64, dtype=np.int64)
    tokens = np.zeros(64, dtype=np.int64)
    # in blocks: temporaries stay small and cache-resident (fresh 100M-element arrays cost more
    # in page faults than the arithmetic)
    for start in range(0, len(lens), _BLOCK):
        block = lens[start : start + _BLOCK]
        # frexp is exact below 2**53: x = m * 2**e with m in [0.5, 1), so floor(log2 x) = e - 1
        exp = np.frexp(block.astype(np.float64))[1] - 1
        counts += np.bincount(exp, minlength=64)
        # float weights are exact here: a block sums < 2**20 lengths of < 2**32 each
        tokens += np.bincount(exp, weights=block, minlength=64).astype(np.int64)
    used = np.flatnonzero(counts)
    first, last = int(used[0]), int(used[-1])
    return [
        Bin(1 << k, 1 << (k + 1), int(counts[k]), int(tokens[k])) for k in range(first, last + 1)
    ]


def summarize(
    lens: np.ndarray, files: int, keys: Mapping[str, np.ndarray] | None = None
) -> Summary:
    """Statistics of a validated length array (non-empty, all > 0)."""
    lens = np.asarray(lens, dtype=np.int64)
    # "inverted_cdf" reports a length that occurs in the data, not an interpolation
    qs = np.percentile(lens, PERCENTILES, method="inverted_cdf")
    key_stats = {
        name: {"min": float(np.min(v)), "mean": float(np.mean(v)), "max": float(np.max(v))}
        for name, v in (keys or {}).items()
    }
    return Summary(
        files=files,
        count=len(lens),
        tokens=int(lens.sum()),
        min=int(lens.min()),
        mean=float(lens.mean()),
        max=int(lens.max()),
        percentiles={percentile_name(q): int(v) for q, v in zip(PERCENTILES, qs, strict=True)},
        histogram=log2_histogram(lens),
        keys=key_stats,
    )


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of ``fraction * width`` cells with eighth-cell resolution.

    >>> bar(0.5, 4), bar(0.0, 4), bar(1e-9, 4)
    ('██', '', '▏')
    """
    eighths = round(fraction * width * 8)
    if fraction > 0 and eighths == 0:
        eighths = 1  # a non-empty bin never looks empty
    full, part = divmod(eighths, 8)
    return "█" * full + ("" if part == 0 else " ▏▎▍▌▋▊▉"[part])


def render(summary: Summary, width: int = 40) -> str:
    """The text ``varpack check`` prints: figures, then one histogram row per length bin."""
    pct = "  ".join(f"{k} {v:,}" for k, v in summary.percentiles.items())
    lines = [
        f"files        {summary.files:,}",
        f"samples      {summary.count:,}",
        f"tokens       {summary.tokens:,}",
        f"length       min {summary.min:,}  mean {summary.mean:,.1f}  max {summary.max:,}",
        f"percentiles  {pct}",
    ]
    for name, st in summary.keys.items():
        lines.append(f"key {name:<8} min {st['min']:g}  mean {st['mean']:g}  max {st['max']:g}")
    lines += ["", *histogram_rows(summary, width)]
    return "\n".join(lines)


def histogram_rows(summary: Summary, width: int = 40) -> list[str]:
    """The histogram's header and one row per bin, every column as wide as its widest cell, so
    that every bar starts in the same column whatever the lengths and counts."""
    top = max((b.count for b in summary.histogram), default=0)
    cells = [
        (
            f"[{b.lo:,}, {b.hi:,})",
            f"{b.count:,}",
            f"{b.count / summary.count:.1%}",
            f"{b.tokens / summary.tokens:.1%}",
            bar(b.count / top, width),
        )
        for b in summary.histogram
    ]
    header = ("seq_len", "samples", "share", "tokens", "")
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(4)]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=False)) + (
            f"  {row[4]}" if row[4] else ""
        )

    return [line(header).rstrip(), *(line(row) for row in cells)]
