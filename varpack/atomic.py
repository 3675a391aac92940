"""Atomic publication of output directories.

Every command writes into a temporary sibling directory and renames it onto the final path only
after everything succeeded, so a reader never sees a half-written output and a failure leaves
nothing behind. ``os.replace`` of a directory is atomic on POSIX within one filesystem, which the
sibling guarantees.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from varpack.errors import OutputExistsError


def check_output(path: str | os.PathLike[str], overwrite: bool) -> Path:
    """Fail early (before any work) when ``path`` exists and ``overwrite`` is false."""
    out = Path(path)
    if out.exists() and not overwrite:
        raise OutputExistsError(f"output {out} already exists; pass --overwrite to replace it")
    return out


def temp_sibling(path: str | os.PathLike[str], token: str | None = None) -> Path:
    """A hidden temporary name next to ``path`` (same filesystem, so the final rename is atomic).

    ``token`` lets several MPI ranks agree on one name (rank 0 draws it and broadcasts it).
    """
    out = Path(path)
    token = token or uuid.uuid4().hex[:12]
    return out.parent / f".{out.name}.tmp-{token}"


def publish(tmp: Path, path: str | os.PathLike[str], overwrite: bool) -> None:
    """Move the finished ``tmp`` onto ``path``, replacing an existing output only if allowed."""
    out = Path(path)
    if out.exists():
        if not overwrite:
            raise OutputExistsError(f"output {out} already exists; pass --overwrite to replace it")
        old = temp_sibling(out, "old-" + uuid.uuid4().hex[:8])
        os.replace(out, old)
        os.replace(tmp, out)
        remove(old)
    else:
        os.replace(tmp, out)


def remove(path: Path) -> None:
    """Remove a file or a directory tree, ignoring a missing one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory; publish it as ``path`` on success, delete it on failure.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_dir(root / "out") as tmp:
    ...     _ = (tmp / "a.txt").write_text("x")
    >>> sorted(p.name for p in (root / "out").iterdir())
    ['a.txt']
    """
    check_output(path, overwrite)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        remove(tmp)
        raise
    try:
        publish(tmp, out, overwrite)
    except BaseException:
        remove(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary file name next to ``path``; publish it as ``path`` on success.

    On failure the temporary file (if the block created it) is removed and ``path`` is untouched.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_file(root / "a.bin") as tmp:
    ...     _ = tmp.write_bytes(b"x")
    >>> sorted(p.name for p in root.iterdir())
    ['a.bin']
    """
    check_output(path, overwrite)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(out)
    try:
        yield tmp
        publish(tmp, out, overwrite)
    finally:
        remove(tmp)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write one file atomically (temporary name in the same directory, then rename)."""
    out = Path(path)
    tmp = temp_sibling(out)
    tmp.write_bytes(data)
    os.replace(tmp, out)
