"""An epoch composed by cost on several threads, the carry resolved after: the same plan.

:func:`~varpack.plan.kernels.compose.compose_run` composes an epoch's windows in turn: what a
window cannot place, and whether a heavy sample waits, is carried into the next. To use ``T``
threads, the epoch is cut at window starts into ``T`` runs of about equal tokens, and every run
is composed at once (the kernel releases the GIL) as if nothing were carried into it: its first
:data:`PREFIX` windows one by one, keeping the carry after each, then the rest in one call.
Then, run after run, the true carry comes in. A run with none in stands as composed. Otherwise
its first windows are composed again with it until the carry after one is the carry found there
(the windows after it compose as found); where none is within the prefix, the rest of the run
is composed again too. So the plan is byte for byte the one-thread plan, whatever the number of
threads; only the time changes. Carries are a few samples and often none, so the carry is
usually resolved within a window. The MPI composer resolves carries between ranks the same way
(:mod:`varpack.make.mpi.compose`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from varpack.errors import env_int
from varpack.plan.kernels.compose import Composed, compose_run

#: windows of each run (after the first) composed one by one, so that a carry coming in can be
#: resolved window by window
PREFIX = 4
#: samples a run holds at least: below, a thread costs more than it saves
MIN_RUN = 1 << 20
#: threads at most by default (the composer's share of a plan stops paying beyond)
MAX_THREADS = 8
#: environment variable setting the number of threads (1: compose in one thread)
THREADS_ENV = "VARPACK_THREADS"


def default_threads() -> int:
    """``$VARPACK_THREADS``, else the CPUs this process may run on (at most :data:`MAX_THREADS`)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return env_int(THREADS_ENV, max(1, min(MAX_THREADS, cpus)), low=1)


@njit(cache=True, nogil=True)
def run_starts(lens, window_tok, runs, prefix):  # type: ignore[no-untyped-def]
    """Where each of ``runs`` runs of about equal tokens starts (at a window start), followed
    by the starts of its next ``prefix`` windows, with the tokens before each: two arrays
    ``(runs, prefix + 1)``; a row of -1 where the epoch holds no such window (run 0 starts at
    0). Windows as in :func:`~varpack.plan.kernels.compose._compose_epoch`: the positions whose
    tokens before them fall in the same multiple of ``window_tok``.

    >>> pos, cum = run_starts(np.full(8, 5), 10, 2, 1)
    >>> pos.tolist(), cum.tolist()
    ([[0, 2], [4, 6]], [[0, 10], [20, 30]])
    """
    total = np.int64(0)
    for i in range(len(lens)):
        total += lens[i]
    pos = np.full((runs, prefix + 1), -1, dtype=np.int64)
    cum = np.full((runs, prefix + 1), -1, dtype=np.int64)
    r, j = 0, 0  # the run being found, and its windows found so far
    target = np.int64(0)  # the window (in multiples of window_tok) run r starts at or after
    before = np.int64(0)
    last_w = np.int64(-1)
    for i in range(len(lens)):
        w = before // window_tok
        if w != last_w:  # a window starts at i
            if j > 0:
                if j <= prefix:
                    pos[r, j], cum[r, j] = i, before
                    j += 1
                if j > prefix:
                    r, j = r + 1, 0
                    if r == runs:
                        break
                    target = (total * r // runs) // window_tok
            if j == 0 and w >= target:
                pos[r, 0], cum[r, 0] = i, before
                j = 1
            last_w = w
        before += lens[i]
    return pos, cum


#: composes a run: its per-position arrays (carried positions first) and its place in the epoch
#: ``(carried, cum0, rest_tok, rest_n, held)``, as :func:`compose_run` reads ``run``
Composer = Callable[
    [tuple[np.ndarray, ...], tuple[int, int, int, int, np.ndarray]], Composed | None
]


@dataclass
class _Epoch:
    """The permuted epoch's per-position arrays and the composer of a run of them."""

    arrays: tuple[np.ndarray, ...]  # the lengths first
    compose: Composer
    total: int  # tokens of the epoch

    def piece(self, a: int, e: int, cum: int, carry: np.ndarray, held: np.ndarray) -> _Out:
        """Positions ``a .. e`` composed after ``carry`` (epoch positions, with their held
        flags), ``cum`` tokens before ``a``: its stream, starts, carry, held flags and wide
        flags, in epoch positions; None where it cannot be composed."""
        nc = len(carry)
        lens = self.arrays[0]
        rest_tok = self.total - cum - int(lens[a:e].sum())
        got = self.compose(tuple(self._joined(x, carry, a, e) for x in self.arrays),
                           (nc, cum, rest_tok, len(lens) - e, held))  # fmt: skip
        if got is None:
            return None
        return _epoch_positions(got.stream, carry, a), got.starts, \
            _epoch_positions(got.carry, carry, a), got.held, got.wide  # fmt: skip

    @staticmethod
    def _joined(x: Any, carry: np.ndarray, a: int, e: int) -> np.ndarray:
        """``x`` at the carried positions, then ``x[a:e]`` (a view where nothing is carried)."""
        return x[a:e] if len(carry) == 0 else np.concatenate((x[carry], x[a:e]))


#: a piece composed: stream, starts, carry, held, wide (None: it cannot be composed)
_Out = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None


def _epoch_positions(local: np.ndarray, carry: np.ndarray, a: int) -> np.ndarray:
    """Positions of a piece's input (``carry`` first, then its own from ``a``) as epoch
    positions, in place."""
    nc = len(carry)
    if nc == 0:
        local += a
        return local
    was = local < nc
    picked = carry[local[was]]
    local += a - nc
    local[was] = picked
    return local


class _Run:
    """A run composed as if nothing were carried in: its prefix windows one by one, the rest
    in one call; then resolved with the carry that comes in."""

    def __init__(self, ep: _Epoch, bounds: list[int], cums: list[int], end: int) -> None:
        self.ep, self.bounds, self.cums, self.end = ep, bounds, cums, end
        self.pieces: list[_Out] = []
        self.error: BaseException | None = None

    def compose(self) -> None:
        """The pieces after an empty carry (run in a thread)."""
        try:
            carry, held = np.zeros(0, np.int64), np.zeros(0, np.bool_)
            self.pieces = self._from(0, carry, held, None)
        except BaseException as e:  # raised again in the calling thread
            self.error = e

    def _from(
        self, j: int, carry: np.ndarray, held: np.ndarray, found: list[_Out] | None
    ) -> list[_Out]:
        """Pieces ``j ..`` composed after ``carry``; with ``found``, only until the carry after
        a prefix window is the found one (then the found pieces after it)."""
        out: list[_Out] = []
        ends = self.bounds[1:] + [self.end]
        for q in range(j, len(self.bounds)):
            got = self.ep.piece(self.bounds[q], ends[q], self.cums[q], carry, held)
            out.append(got)
            if got is None:
                return out
            carry, held = got[2], got[3]
            if found is not None and q < len(found) - 1 and _same(got, found[q]):
                return out + found[q + 1 :]
        return out

    def resolved(self, carry: np.ndarray, held: np.ndarray) -> list[_Out]:
        """The pieces after the true ``carry`` (and held flags) coming in."""
        if len(carry) == 0:
            return self.pieces
        return self._from(0, carry, held, self.pieces)


def _same(x: _Out, y: _Out) -> bool:
    """The same carry (and held flags) after a piece."""
    if x is None or y is None:
        return False
    return np.array_equal(x[2], y[2]) and np.array_equal(x[3], y[3])


def compose_threaded(
    plens: np.ndarray,
    alone: np.ndarray,
    coeffs: tuple[float, float],
    window_tokens: int,
    step_tokens: int,
    dp: int,
    k: int,
    multiple: int,
    budget: int,
    fill: float = 0.0,
    sources: tuple[np.ndarray, np.ndarray, float] | None = None,
    level: bool = True,
    mix: bool = False,
    threads: int | None = None,
    min_run: int | None = None,
) -> Composed | None:
    """:func:`compose_run` of a whole epoch on ``threads`` threads (default
    :func:`default_threads`): the same result (see the module doc). ``min_run``: samples a
    run holds at least (default :data:`MIN_RUN`; fewer threads where the epoch is short)."""
    args = (coeffs, window_tokens, step_tokens, dp, k, multiple, budget, fill)

    def run(
        arrays: tuple[np.ndarray, ...], at: tuple[int, int, int, int, np.ndarray]
    ) -> Composed | None:
        lens, lone, *src = arrays
        blend = None if sources is None else (src[0], sources[1], sources[2])
        return compose_run(lens, lone, *args, blend, at, level, mix)

    arrays = (plens, alone) if sources is None else (plens, alone, sources[0])
    return threaded(arrays, run, window_tokens, step_tokens, dp * k, threads, min_run)


def threaded(
    arrays: tuple[np.ndarray, ...],
    compose: Composer,
    window_tokens: int,
    tail_tokens: int,
    per_step: int,
    threads: int | None = None,
    min_run: int | None = None,
) -> Composed | None:
    """A whole epoch (``arrays``: its per-position arrays, the lengths first) composed by
    ``compose`` on ``threads`` threads (default :func:`default_threads`): the same result as one
    call on the whole epoch (see the module doc). ``tail_tokens``, ``per_step``: a tail of
    fewer tokens or fewer than two steps' positions joins the window before (the composer's
    rule); ``min_run``: samples a run holds at least (default :data:`MIN_RUN`)."""
    threads = default_threads() if threads is None else max(1, threads)
    min_run = MIN_RUN if min_run is None else min_run
    plens = arrays[0]
    whole = (0, 0, 0, 0, np.zeros(0, dtype=np.bool_))
    runs = int(min(threads, len(plens) // max(1, min_run)))
    spans = (_spans(plens, max(window_tokens, 1), tail_tokens, per_step, runs, min_run)
             if runs > 1 else [])  # fmt: skip
    if len(spans) < 2:
        return compose(arrays, whole)
    ep = _Epoch(arrays, compose, int(plens.sum()))
    parts = [_Run(ep, b, c, e) for b, c, e in spans]
    _in_threads([p.compose for p in parts[1:]], parts[0].compose)
    for p in parts:
        if p.error is not None:
            raise p.error
    pieces: list[_Out] = list(parts[0].pieces)
    for p in parts[1:]:
        if pieces[-1] is None:
            return None
        pieces += p.resolved(pieces[-1][2], pieces[-1][3])
    if any(x is None for x in pieces):
        return None
    return _joined_pieces(pieces)  # type: ignore[arg-type]


def _spans(
    plens: np.ndarray, window_tok: int, step_tok: int, per_step: int, runs: int, min_run: int
) -> list[tuple[list[int], list[int], int]]:
    """Each run's piece starts (its start, then its prefix windows'), the tokens before each,
    and its end; the first run is one piece. A run is left out (its windows go to the run
    before) where its prefix would reach into the next run, or where the epoch's tail after it
    is short enough to join a window (``step_tok`` tokens or ``2 * per_step`` positions, as
    the kernel's rule; ``min_run // 4`` positions kept as margin)."""
    pos, cum = run_starts(plens, np.int64(window_tok), np.int64(runs), np.int64(PREFIX))
    n, total = len(plens), int(plens.sum())
    kept: list[tuple[list[int], list[int]]] = [([0], [0])]
    for r in range(1, runs):
        b, c = [int(x) for x in pos[r]], [int(x) for x in cum[r]]
        if b[-1] < 0 or b[0] <= kept[-1][0][-1]:
            continue
        if total - c[-1] < step_tok or n - b[-1] < max(2 * per_step, min_run // 4):
            break
        kept.append((b, c))
    ends = [b[0] for b, _ in kept[1:]] + [n]
    return [(b, c, e) for (b, c), e in zip(kept, ends, strict=True)]


def _in_threads(others: list[Callable[[], None]], own: Callable[[], None]) -> None:
    """``others`` each in a daemon thread (an interrupt does not wait for them), ``own`` in
    this thread, then wait for all."""
    workers = [threading.Thread(target=f, daemon=True, name="varpack-compose") for f in others]
    for t in workers:
        t.start()
    own()
    for t in workers:
        t.join()


def _joined_pieces(pieces: list[tuple[np.ndarray, ...]]) -> Composed:
    """The pieces' streams one after the other, their micro-batch starts shifted alike."""
    sizes = [len(x[0]) for x in pieces]
    offs = np.cumsum([0, *sizes])
    starts = np.concatenate([x[1][:-1] + o for x, o in zip(pieces, offs[:-1], strict=True)]
                            + [offs[-1:]])  # fmt: skip
    stream = np.concatenate([x[0] for x in pieces])
    wide = np.concatenate([x[4] for x in pieces])
    return Composed(stream, starts.astype(np.int64, copy=False), pieces[-1][2], pieces[-1][3], wide)
