"""Composing by cost under MPI: every rank composes its windows at once, the carry resolved after.

One process composes an epoch's windows in turn (the composer's or the balance engine's rule,
``how.compose``): what a window cannot place, and whether a heavy sample waits, is carried into the
next. So rank ``k``'s first window depends on rank ``k-1``'s last, and relaying that carry would
compose the ranks one after the other. Instead each rank composes its windows at once as if
nothing were carried in, keeping the carry after each window; then, rank after rank, the true
carry comes in: a rank with none in has its plan already; else it composes its windows again from
the first, with the carry, until the carry after a window is the one it found (the windows after
that compose as found). Carries are a few samples and often none, so this takes a few windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from varpack.make.mpi.moves import Rows, count, relayed
from varpack.plan.stages.batching.costed import Composing
from varpack.plan.stages.batching.engine import EngineRule


@dataclass
class _Windows:
    """This rank's windows and where they sit in the epoch's stream."""

    lens: np.ndarray  # own rows (index i), then the rows carried in (index n + i)
    alone: np.ndarray
    extra: Rows  # the rows carried in
    starts: list[int]  # window starts (own rows), and the end
    before: np.ndarray  # tokens of the stream before each window start (and the end)
    total: int  # tokens of the stream
    size: int  # positions of the stream
    at: int  # positions before this rank's own rows
    how: Composing | EngineRule


#: stream, starts, carry, held, and for each stream entry whether its window was dealt wide
_Out = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _window(w: _Windows, j: int, carry: np.ndarray, held: np.ndarray) -> _Out | None:
    """Window ``j`` composed after ``carry`` (indices into ``w.lens``) with its held flags."""
    a, b = w.starts[j], w.starts[j + 1]
    idx = np.concatenate((carry, np.arange(a, b, dtype=np.int64)))
    before = int(w.before[j])
    run = (len(carry), before, w.total - int(w.before[j + 1]), w.size - w.at - b, held)
    lens, alone = _pick(w.lens, w.extra["lens"], idx), _pick(w.alone, w.extra["alone"], idx)
    got = w.how.compose((lens, alone), run)
    if got is None:
        return None
    wide = got.wide if len(got.wide) else np.zeros(len(got.stream), dtype=np.bool_)
    return idx[got.stream], got.starts, idx[got.carry], got.held, wide


def _same(x: _Out | None, y: _Out | None) -> bool:
    """The same carry (and held flags) after a window."""
    if x is None or y is None:
        return False
    return np.array_equal(x[2], y[2]) and np.array_equal(x[3], y[3])


def _all(
    w: _Windows, carry: np.ndarray, held: np.ndarray, found: _Found | None
) -> list[_Out | None]:
    """Every window composed after ``carry``; with ``found`` (the windows composed with no
    carry), only until the carry after a window is the found one."""
    out: list[_Out | None] = []
    for j in range(len(w.starts) - 1):
        got = _window(w, j, carry, held)
        out.append(got)
        if got is None:
            return out
        carry, held = got[2], got[3]
        if found is not None and found.same(j, got):
            return out
    return out


class _Found:
    """The windows composed as if nothing were carried in: their streams in one buffer (no
    second copy), each window's micro-batch starts and the carry it hands on."""

    def __init__(self, w: _Windows) -> None:
        n = w.starts[-1]
        self.stream = np.empty(n, dtype=np.int64)
        self.wide = np.zeros(n, dtype=np.bool_)
        self.at = [0]  # where each window's stream starts in ``stream``
        self.bounds: list[np.ndarray] = []
        self.carries: list[tuple[np.ndarray, np.ndarray]] = []
        self.failed = False
        carry, held = np.zeros(0, np.int64), np.zeros(0, bool)
        for j in range(len(w.starts) - 1):
            got = _window(w, j, carry, held)
            if got is None:
                self.failed = True
                break
            a = self.at[-1]
            self.stream[a : a + len(got[0])] = got[0]
            self.wide[a : a + len(got[0])] = got[4]
            self.at.append(a + len(got[0]))
            self.bounds.append(got[1])
            carry, held = got[2], got[3]
            self.carries.append((carry, held))

    def same(self, j: int, got: _Out) -> bool:
        """Is the carry after window ``j`` the one found?"""
        if j >= len(self.carries):
            return False
        carry, held = self.carries[j]
        return np.array_equal(got[2], carry) and np.array_equal(got[3], held)


def compose_share(
    comm: Any, rows: Rows, starts: list[int], how: Composing | EngineRule
) -> tuple[Rows, np.ndarray] | None:
    """This rank's windows (``starts``: where each starts, and the end; whole on this rank)
    composed by cost: ``(rows, starts)`` in the composed order (with a column ``_wide``: was
    the row's window dealt window-wide), or None on the rank whose last window could not be
    composed. ``how``: the epoch's composition (:func:`~varpack.plan.stages.batching.costed.
    composing` or :func:`~varpack.plan.stages.batching.engine.engine_rule`, the one-process
    planner's rule)."""
    n, lens = count(rows), rows["lens"].astype(np.int64, copy=False)
    sizes = comm.allgather((n, int(lens.sum())))
    at = sum(c for c, _ in sizes[: comm.Get_rank()])
    cum0 = sum(t for _, t in sizes[: comm.Get_rank()])
    ends = np.asarray(starts[1:], dtype=np.int64)
    sums = np.add.reduceat(lens, starts[:-1]) if n else np.zeros(0, np.int64)
    before = cum0 + np.cumsum(np.concatenate(([0], sums)), dtype=np.int64)  # per window start
    assert len(before) == len(starts) and (not n or ends[-1] == n)
    w = _Windows(lens, rows["alone"], {k: v[:0] for k, v in rows.items()}, starts, before,
                 sum(t for _, t in sizes), sum(c for c, _ in sizes), at, how)  # fmt: skip
    found = _Found(w)  # as if nothing were carried in: at once on every rank
    none = np.zeros(0, np.int64), np.zeros(0, bool)

    def work(got: tuple[Rows, np.ndarray] | None) -> tuple[Any, tuple[Rows, np.ndarray]]:
        carried = {k: v[:0] for k, v in rows.items()} if got is None else got[0]
        held = none[1] if got is None else got[1]
        redone: list[_Out | None] = []
        if count(carried):
            w.extra = carried
            redone = _all(w, np.arange(n, n + count(carried), dtype=np.int64), held, found)
        if any(x is None for x in redone) or (found.failed and len(redone) < len(starts) - 1):
            return None, ({k: v[:0] for k, v in rows.items()}, none[1])
        if len(starts) == 1:  # no window here: the carry goes on
            empty = _taken(rows, carried, [none[0]])
            empty["_wide"] = np.zeros(0, np.bool_)
            return (empty, np.zeros(1, np.int64)), (carried, held)
        return _assembled(rows, carried, found, [x for x in redone if x is not None])

    return relayed(comm, work, None)


def _assembled(
    rows: Rows, carried: Rows, found: _Found, redone: list[_Out]
) -> tuple[tuple[Rows, np.ndarray], tuple[Rows, np.ndarray]]:
    """This rank's composed rows and micro-batch starts: the windows composed again with the
    carry (``redone``), then the found ones after them; and what it hands on."""
    j, nwin = len(redone), len(found.bounds)
    rest = range(j, nwin)  # found windows still standing
    parts = [x[0] for x in redone] + ([found.stream[found.at[j] : found.at[-1]]] if rest else [])
    sizes = [len(x[0]) for x in redone] + [found.at[k + 1] - found.at[k] for k in rest]
    every = [x[1] for x in redone] + [found.bounds[k] for k in rest]
    offs = np.cumsum([0, *sizes])
    bounds = np.concatenate(
        [b[:-1] + o for b, o in zip(every, offs[:-1], strict=True)] + [offs[-1:]]
    )
    left, held = found.carries[-1] if rest else (redone[-1][2], redone[-1][3])
    handed = _taken(rows, carried, [left], copy=True)  # before the rows are replaced
    taken = _taken(rows, carried, parts)
    taken["_wide"] = np.concatenate(
        [x[4] for x in redone] + [found.wide[found.at[j] : found.at[-1]]]
    )
    found.stream = found.stream[:0]
    return (taken, bounds), (handed, held)


def _pick(
    own: np.ndarray, extra: np.ndarray, idx: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """``own`` followed by ``extra``, at ``idx`` (without joining the two), into ``out``."""
    n = len(own)
    out = np.empty(len(idx), dtype=own.dtype) if out is None else out
    if len(extra) == 0 or len(idx) == 0 or int(idx.max()) < n:
        return np.take(own, idx, out=out, mode="clip")  # "raise" would buffer a copy
    mine = idx < n
    out[mine] = own[idx[mine]]
    out[~mine] = extra[idx[~mine] - n]
    return out


def _taken(rows: Rows, carried: Rows, parts: list[np.ndarray], copy: bool = False) -> Rows:
    """Rows ``parts`` (index arrays, one after the other) of this rank's rows followed by the
    ``carried`` ones, column by column (the rows' columns replaced one at a time unless
    ``copy``)."""
    out = rows if not copy else {}
    total = sum(len(x) for x in parts)
    for k in list(rows):
        col = np.empty(total, dtype=rows[k].dtype)
        at = 0
        for x in parts:
            _pick(rows[k], carried[k], x, col[at : at + len(x)])
            at += len(x)
        out[k] = col
    return out
