"""Helpers of the MPI planner that need no MPI: block weights and joins in place."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from varpack.make.mpi import read
from varpack.make.mpi.moves import join, join_into


class _Tracked(np.ndarray):
    """An ndarray subclass, so that a weak reference can tell when it is freed."""


def _rows(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "ids": rng.integers(0, 10**9, n).view(_Tracked),
        "lens": rng.integers(1, 9000, n).view(_Tracked),
    }


@pytest.mark.parametrize("shape", [(3, 5, 0), (0, 7, 2), (4, 0, 0), (0, 0, 0), (6, 6, 6)])
def test_join_into_gives_the_join_and_lets_the_old_columns_go(shape: tuple[int, int, int]) -> None:
    a, b, c = (_rows(n, k) for k, n in enumerate(shape))
    want = join([a, b, c], b)
    want = {k: np.array(v) for k, v in want.items()}
    into = b
    old = [weakref.ref(v.base if v.base is not None else v) for v in into.values()]
    got = join_into([a, into, c], into)
    assert got is into and list(got) == ["ids", "lens"]
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])
    gc.collect()
    if sum(shape) != shape[1] and shape[1]:  # copied: the old columns are gone
        assert all(r() is None for r in old)


def test_block_weights_sum_rows_and_tokens_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    n = 3 * read._CHUNK + 12345  # several chunks, blocks across chunk edges
    lens = np.sort(rng.integers(1, 16384, n))
    monkeypatch.setattr(read, "read_run", lambda _p, lo, hi, verify: (None, lens[lo:hi]))
    block, per = 70_001, 5000.0
    nblocks = -(-n // block)
    a, b = 123_457, n - 999
    got = read._weigh("sorted.bin", a, b, block, nblocks, per)
    at = np.arange(a, b) // block
    want = np.bincount(at, read.ROW_BYTES + read.MICRO_BYTES * lens[a:b] / per, nblocks)
    assert np.allclose(got, want, rtol=1e-12)


def test_join_into_holds_one_column_twice_at_most() -> None:
    """The point of joining in place: a share plus one column at the peak, not two shares
    (numpy reports its buffers to tracemalloc)."""
    import tracemalloc

    from varpack.make.mpi.moves import take

    n = 1_000_000
    tracemalloc.start()  # before the columns are made, so that their frees count too
    rows = {k: np.arange(n, dtype=np.int64) for k in ("ids", "lens", "pos")}
    head = {k: np.zeros(10, np.int64) for k in rows}
    kept = take(rows, 5, n)  # views, as a move keeps its own rows
    share = 3 * 8 * n
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    join_into([head, kept], rows)
    del kept
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert rows["ids"][10] == 5 and len(rows["pos"]) == n + 5
    assert peak < 1.5 * share / 3 + 2**20  # one new column alive with the old ones, no more
