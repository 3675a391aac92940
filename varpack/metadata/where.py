"""Selection by SQL: ``--where "score > 0.5 AND lang = 'en'"`` over the metadata, lazily.

The condition is a SQL ``WHERE`` clause over the metadata's columns, evaluated by polars over
every shard at once: ``scan_parquet`` of the file list, one ``SQLContext`` query ``SELECT
sample_id FROM metadata WHERE ...``, so polars reads only the columns the condition names (and
``sample_id``) and pushes the predicate into the scan. What comes back is the set of kept ids;
the caller reads the metadata itself, with every contract check (:mod:`.contract`), and keeps
the rows whose id is in the set (:func:`keep`). An unknown column or a SQL error is one line
naming it and the columns there are; a condition that keeps nothing is refused.

polars is imported here only, when a condition is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from varpack.errors import ConfigError, InputError


@dataclass(frozen=True)
class Where:
    """A condition and what it kept (plan.json's ``selection``)."""

    sql: str
    source: str
    samples: int  # rows of the metadata
    tokens: int
    kept_samples: int
    kept_tokens: int

    def entry(self) -> dict[str, Any]:
        return {
            "where": self.sql,
            "from": self.source,
            "samples": self.samples,
            "tokens": self.tokens,
            "kept_samples": self.kept_samples,
            "kept_tokens": self.kept_tokens,
        }

    def line(self) -> str:
        """``where SQL: kept N of M samples (x %), T of U tokens (y %)``."""
        return (
            f"where {self.sql}: kept {self.kept_samples:,} of {self.samples:,} samples "
            f"({100 * self.kept_samples / max(self.samples, 1):.2f}%), {self.kept_tokens:,} of "
            f"{self.tokens:,} tokens ({100 * self.kept_tokens / max(self.tokens, 1):.2f}%)"
        )


def check_sql(sql: str) -> str:
    """The condition, stripped; refused when empty or holding a statement separator."""
    text = " ".join(sql.split())
    if not text:
        raise ConfigError("--where: the condition is empty; give a SQL condition (score > 0.5)")
    if ";" in text:
        raise ConfigError(f"--where {sql!r}: one condition, no ';' (a WHERE clause, not a query)")
    return text


def where_ids(
    files: Sequence[str], sql: str, lf: Any = None, plan_only: bool = False
) -> np.ndarray:
    """The sorted ids (``sample_id``, else ``id``) of the rows of ``files`` that satisfy the
    condition ``sql``. ``lf``: the rows as a polars LazyFrame (a share of the row groups of
    ``files``; default: all of them). ``plan_only``: resolve the query (its columns and types:
    the errors a condition can have) and read nothing."""
    import polars as pl

    text = check_sql(sql)
    lf = pl.scan_parquet(list(files)) if lf is None else lf
    names: list[str] = []
    try:
        names = lf.collect_schema().names()
        # metadata names its ids sample_id; tokenized data (a --carry-from source) may say id
        key = next((c for c in ("sample_id", "id") if c in names), "sample_id")
        query = pl.SQLContext(metadata=lf, eager=False).execute(
            f'SELECT "{key}" FROM metadata WHERE {text}'
        )
        if plan_only:
            query.collect_schema()
            return np.zeros(0, dtype=np.int64)
        ids = query.collect().get_column(key).to_numpy()
    except pl.exceptions.PolarsError as exc:
        why = _first_line(exc)
        have = "" if "valid columns" in why else f" (columns: {', '.join(names)})"
        raise ConfigError(
            f"--where {text!r}: {why}{have}; write a SQL condition over the metadata's columns"
        ) from None
    return np.sort(np.asarray(ids, dtype=np.int64))


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(exc).__name__


def keep(
    ids: np.ndarray, lens: np.ndarray, kept: np.ndarray, sql: str, source: str
) -> tuple[np.ndarray, Where]:
    """The mask of ``ids`` (the metadata's) whose id is in ``kept`` (sorted), and the record of
    what it kept; a condition that keeps nothing is refused.

    >>> mask, w = keep(np.array([5, 3, 9]), np.array([10, 20, 30]), np.array([3, 9]), "x", "m")
    >>> mask.tolist(), w.kept_samples, w.kept_tokens
    ([False, True, True], 2, 50)
    """
    mask = members(ids, kept)
    total, kept_tokens = int(lens.sum()), int(lens[mask].sum())
    n = int(mask.sum())
    if n == 0:
        raise none_kept(sql, len(ids), source)
    return mask, Where(sql, source, len(ids), total, n, kept_tokens)


def members(ids: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Which ``ids`` are in ``kept`` (sorted).

    >>> members(np.array([5, 3, 9]), np.array([3, 9])).tolist()
    [False, True, True]
    """
    pos = np.minimum(np.searchsorted(kept, ids), max(len(kept) - 1, 0))
    return kept[pos] == ids if len(kept) else np.zeros(len(ids), dtype=bool)


def none_kept(sql: str, samples: int, source: str) -> InputError:
    """The error of a condition that keeps none of the ``samples``."""
    return InputError(
        f"--where {sql!r}: keeps none of the {samples:,} samples of {source}; loosen the "
        "condition (varpack check INPUT --where ... shows what it keeps)"
    )
