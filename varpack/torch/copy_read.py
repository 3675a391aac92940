"""Reading samples' tokens out of Arrow IPC copies: by ``pread`` (default) or a memory map.

A micro-batch names a few hundred samples scattered over the copy. Read through a memory map,
every page the gather touches counts in the process's RSS, and on Linux a touch of a file
written recently maps its whole large folio (up to 2 MiB): the first micro-batch of a 10 M-sample
copy mapped 350 MB, for 2 MB of tokens. Those pages are the node's shared page cache, but RSS
is what schedulers and OOM killers watch. ``read="pread"`` copies exactly the bytes it needs into
the batch instead, so the process grows by the batch and the page cache stays shared and
uncounted; ``read="mmap"`` keeps the zero-syscall gather, about 3x faster per sample when the
copy is hot in the page cache and samples are tiny (``bench_startup.py`` prints both).

Reads are coalesced: samples whose byte ranges lie within :data:`GAP` bytes of each other are
read with one call (the gap read along), so a syscall is paid per distinct region, not per
sample. Handles are opened lazily per process and dropped when pickled (DataLoader workers).
"""

from __future__ import annotations

import mmap
import os
from typing import Any, BinaryIO

import numpy as np

from varpack.errors import InputError
from varpack.metadata import token_check
from varpack.metadata.token_copies import Reads
from varpack.torch.gather import segment_gather_index

token_check.warm()  # numba's one-time start, here with the imports rather than in a first batch

#: how a copy is read: ``pread`` (copied into the batch) or ``mmap`` (mapped, gathered)
READS = ("pread", "mmap")
#: samples closer than this many bytes are read with one call: a syscall costs about as much
#: as copying 8 KiB
GAP = 8 * 1024


def check_read_mode(read: str) -> str:
    """``read`` if it is one of :data:`READS`.

    >>> check_read_mode("mmap")
    'mmap'
    >>> check_read_mode("direct")
    Traceback (most recent call last):
    varpack.errors.InputError: read='direct' is not a way to read a token copy; pass one of: pread, mmap
    """
    if read not in READS:
        raise InputError(
            f"read={read!r} is not a way to read a token copy; pass one of: {', '.join(READS)}"
        )
    return read


def spans(starts: np.ndarray, ends: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of the regions that cover ``[starts, ends)`` with gaps of at most ``gap``.

    >>> [x.tolist() for x in spans(np.array([100, 0, 12]), np.array([110, 10, 20]), 1)]
    [[0, 12, 100], [10, 20, 110]]
    >>> [x.tolist() for x in spans(np.array([100, 0, 12]), np.array([110, 10, 20]), 5)]
    [[0, 100], [20, 110]]
    """
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)  # ranges may overlap (a sample twice, pieces of one)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1] + gap
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


class CopyFiles:
    """The token copies ``files``, read by ``read`` (one of :data:`READS`)."""

    def __init__(self, files: list[str], read: str = "pread") -> None:
        self.files, self.read = files, check_read_mode(read)
        self._open: dict[int, Any] = {}  # per process: file objects or mapped arrays

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": {}}

    def is_open(self) -> bool:
        return bool(self._open)

    def gather(self, f: int, dtype: np.dtype, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """Tokens ``[start, start + len)`` of file ``f`` for each pair, concatenated; positions
        are counted in tokens of ``dtype`` from the start of the file."""
        src, at = self._source(f, dtype, starts, lens)
        return src[segment_gather_index(at, lens)]

    def _source(
        self, f: int, dtype: np.dtype, starts: np.ndarray, lens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of file ``f`` holding ``[start, start + len)`` of each pair, and where each
        starts in them: the whole mapping, or the regions read by ``pread``."""
        if self.read == "mmap":
            return self._mapped(f, dtype), starts
        item = dtype.itemsize
        lo, hi = spans(starts * item, (starts + lens) * item, GAP)
        size = hi - lo
        at = np.zeros(len(lo) + 1, dtype=np.int64)
        np.cumsum(size, out=at[1:])
        buf = np.empty(int(at[-1]), dtype=np.uint8)
        self._read_spans(f, buf, lo, at)
        # where each sample starts in buf, in tokens: its span's place plus its offset in it
        k = np.searchsorted(lo, starts * item, side="right") - 1
        return buf.view(dtype), (at[k] + starts * item - lo[k]) // item

    def gather_files(
        self, files: np.ndarray, dtype: np.dtype, starts: np.ndarray, lens: np.ndarray
    ) -> np.ndarray:
        """:meth:`gather` of samples that lie in the files ``files`` (one per sample), in the
        samples' order: one gather per file."""
        if len(self.files) == 1:
            return self.gather(0, dtype, starts, lens)
        dst = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=dst[1:])
        out = np.empty(int(dst[-1]), dtype=dtype)
        for f in np.unique(files).tolist():
            sel = np.flatnonzero(files == f)
            out[segment_gather_index(dst[sel], lens[sel])] = self.gather(
                f, dtype, starts[sel], lens[sel]
            )
        return out

    def gather_verified(self, dtype: np.dtype, reads: Reads, ids: np.ndarray) -> np.ndarray:
        """The ``reads`` of samples ``ids`` (:meth:`~varpack.metadata.token_copies.Opened.
        reads`), concatenated, each verified against its check values while it is copied
        (:func:`~varpack.metadata.token_check.gather_verified`); one line names the first that
        fails. One pass per file."""
        count = reads.count
        dst = np.cumsum(count) - count
        out = np.empty(int(count.sum()), dtype=dtype)
        every = len(self.files) == 1
        for f in [0] if every else np.unique(reads.file).tolist():
            sel = slice(None) if every else np.flatnonzero(reads.file == f)
            src, at = self._source(f, dtype, reads.start[sel], count[sel])
            bad = token_check.gather_verified(
                src, at, count[sel], out, dst[sel], ids[sel], reads.length[sel],
                reads.k0[sel], reads.check[sel], reads.tables[f],
            )  # fmt: skip
            if bad >= 0:
                reads.refuse(int(np.arange(len(count))[sel][bad]), ids)
        return out

    def _read_spans(self, f: int, buf: np.ndarray, lo: np.ndarray, at: np.ndarray) -> None:
        handle = self._file(f)
        view = buf.data  # bytes: buf is uint8
        for off, a, b in zip(lo.tolist(), at[:-1].tolist(), at[1:].tolist(), strict=True):
            while a < b:  # a read may return less than asked; zero means the file ended
                got = _pread(handle, view[a:b], off)
                if got == 0:
                    raise InputError(
                        f"{self.files[f]}: ends at byte {off} where the copy's index places "
                        "tokens; the copy was truncated or rewritten since its index was made "
                        "(re-run varpack lengths --arrow-copy)"
                    )
                a, off = a + got, off + got

    def _file(self, f: int) -> BinaryIO:
        handle = self._open.get(f)
        if handle is None:
            handle = self._open[f] = open(self.files[f], "rb", buffering=0)  # noqa: SIM115
        return handle

    def _mapped(self, f: int, dtype: np.dtype) -> np.ndarray:
        """File ``f``'s whole mapping as an array of tokens (per process, zero-copy)."""
        view = self._open.get(f)
        if view is None:
            with open(self.files[f], "rb") as fh:
                raw = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            view = self._open[f] = np.frombuffer(raw, dtype=dtype, count=len(raw) // dtype.itemsize)
        return view


def _pread(handle: BinaryIO, into: memoryview, offset: int) -> int:
    """Read into ``into`` from ``offset`` without moving a shared file position where the
    platform allows (``os.preadv``); elsewhere seek and read (handles are per process)."""
    if hasattr(os, "preadv"):
        return os.preadv(handle.fileno(), [into], offset)
    handle.seek(offset)
    return handle.readinto(into) or 0  # type: ignore[attr-defined]
