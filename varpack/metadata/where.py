"""Selection by SQL: ``--where "score > 0.5 AND lang = 'en'"`` over the metadata, lazily.

The condition is a SQL ``WHERE`` clause over the metadata's columns, checked first by
:mod:`.condition` (an expression over one row, bounded in size: no subquery, file, aggregate
or clock reaches polars), then evaluated by polars over every shard at once: ``scan_parquet``
of the file list, one ``SQLContext`` query ``SELECT sample_id FROM metadata WHERE ...``, so
polars reads only the columns the condition names (and ``sample_id``) and pushes the predicate
into the scan. What comes back is the set of kept ids; the caller reads the metadata itself,
with every contract check (:mod:`.contract`), and keeps the rows whose id is in the set
(:func:`keep`). An unknown column or a SQL error is one line naming it and the columns there
are; a condition that selects nothing is refused.

polars runs in a worker thread while the main thread waits where a signal still raises
(:func:`varpack.atomic.interruptible`): a long evaluation ends on SIGTERM or Ctrl-C at once,
not when polars returns.

polars is imported here only, when a condition is given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from varpack.errors import ConfigError, InputError
from varpack.metadata.condition import check_columns, parse

T = TypeVar("T")


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

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> Where:
        """The record plan.json's ``selection`` holds (:meth:`entry`)."""
        return cls(entry["where"], entry["from"], entry["samples"], entry["tokens"],
                   entry["kept_samples"], entry["kept_tokens"])  # fmt: skip

    def line(self) -> str:
        """``where SQL: selected N of M samples (x %), T of U tokens (y %)`` (the condition on
        one line, shortened past :data:`SHOWN` characters).

        >>> Where("lang = 'en'", "m", 600, 7000, 1, 5).line()
        "where lang = 'en': selected 1 of 600 samples (0.17%), 5 of 7,000 tokens (0.07%)"
        """
        return (
            f"where {shown(self.sql)}: selected {self.kept_samples:,} of {self.samples:,} "
            f"sample{'s' * (self.samples != 1)} ({100 * self.kept_samples / max(self.samples, 1):.2f}%), "
            f"{self.kept_tokens:,} of {self.tokens:,} token{'s' * (self.tokens != 1)} "
            f"({100 * self.kept_tokens / max(self.tokens, 1):.2f}%)"
        )


#: a condition longer than this is shortened in a summary line (plan.json keeps it whole)
SHOWN = 200


def shown(sql: str) -> str:
    r"""The condition as a summary line shows it: one line, at most :data:`SHOWN` characters.

    >>> print(shown("lang = 'a\nb'"), shown("x" * 300)[-5:])
    lang = 'a\nb' x ...
    """
    one = sql.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return one if len(one) <= SHOWN else one[:SHOWN] + " ..."


def check_sql(sql: str, flag: str = "--where") -> str:
    """The condition's text, checked (:func:`.condition.parse`: not empty, bounded, an
    expression over one row); ``flag`` names where it came from in an error."""
    return parse(sql, flag).text


def where_ids(
    files: Sequence[str],
    sql: str,
    lf: Any = None,
    plan_only: bool = False,
    flag: str = "--where",
) -> np.ndarray:
    """The sorted ids (``sample_id``, else ``id``) of the rows of ``files`` that satisfy the
    condition ``sql``. ``lf``: the rows as a polars LazyFrame (a share of the row groups of
    ``files``; default: all of them). ``plan_only``: resolve the query (its columns and types:
    the errors a condition can have) and read nothing."""
    import polars as pl

    cond = parse(sql, flag)
    lf = pl.scan_parquet(list(files)) if lf is None else lf
    names: list[str] = []
    try:
        names = lf.collect_schema().names()
        check_columns(cond, names, flag)
        # metadata names its ids sample_id; tokenized data (a --carry-from source) may say id
        key = next((c for c in ("sample_id", "id") if c in names), "sample_id")
        query = pl.SQLContext(metadata=lf, eager=False).execute(
            f'SELECT "{key}" FROM metadata WHERE {cond.text}'
        )
        if plan_only:
            query.collect_schema()
            return np.zeros(0, dtype=np.int64)
        ids = in_thread(lambda: query.collect().get_column(key).to_numpy())
    except pl.exceptions.PolarsError as exc:
        why = _first_line(exc)
        have = "" if "valid columns" in why else f" (columns: {', '.join(names)})"
        raise ConfigError(
            f"{flag} {cond.text!r}: {why}{have}; write a SQL condition over the metadata's columns"
        ) from None
    return np.sort(np.asarray(ids, dtype=np.int64))


def in_thread(work: Callable[[], T], poll: float = 0.1) -> T:
    """``work()`` run in a daemon thread while this thread waits in short joins, so that a
    signal's handler runs here at once (a call into polars would hold it until polars returns)
    and its exception leaves the wait; the abandoned thread ends with the process.

    >>> in_thread(lambda: 6 * 7)
    42
    """
    done: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            done.append((True, work()))
        except BaseException as exc:  # handed to the waiting thread
            done.append((False, exc))

    worker = threading.Thread(target=run, name="varpack-where", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(poll)
    ok, value = done[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


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
        f"--where {shown(sql)!r}: selects none of the {samples:,} samples of {source}; loosen "
        "the condition (varpack check INPUT --where ... shows what it selects)"
    )
