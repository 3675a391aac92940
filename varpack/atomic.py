"""Safe publication of outputs: never over an input, all at once, nothing left when interrupted.

Every command writes into a temporary sibling of its output (same filesystem: ``os.replace`` is
atomic), renamed onto the output once all succeeded: no half-written output, no failure's rest.
Before any work, :func:`check_output` refuses an output that equals, contains or lies inside an
input (real paths, symlinks followed), an existing output without ``--overwrite``, and, with it,
anything varpack did not write itself (:func:`is_varpack_output`: a plan, a sort output, or a
directory with varpack's marker file), and an output of varpack's that holds files its index does
not list (:func:`foreign_files`: the user's notes or checkpoints are never deleted). Temporaries
are registered while they live, with a lock file naming their owner (pid, host).
:func:`interruptible` turns SIGTERM, SIGINT and SIGHUP into :class:`Interrupted`, so every
``with`` block's cleanup runs; a process killed outright (SIGKILL) leaves its temporary, removed
by the next run for the same output once its owner is gone (:func:`clean_stale`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from varpack.errors import Interrupted, OutputError, OutputExistsError, WriteError, deferred

#: marker file of directories varpack writes that have no index of their own (metadata, synth)
MARKER = "_varpack.json"
_OWN_INDEXES = {"plan.json": "varpack.plan", "_index.json": "varpack.sorted"}
_LIVE: set[Path] = set()  # temporaries this process owns
_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
_HINTS = {
    errno.ENOSPC: "the disk is full: free space or write elsewhere",
    errno.EDQUOT: "the disk quota is exhausted: free space or write elsewhere",
    errno.EROFS: "the filesystem is read-only: write elsewhere",
    errno.EACCES: "permission denied: write where you may, or fix the permissions",
    errno.EPERM: "operation not permitted: write where you may, or fix the permissions",
    errno.EFBIG: "a file grew over the size this system allows (ulimit -f?): raise it or "
    "write elsewhere",
}


def write_error(path: str | os.PathLike[str], exc: OSError) -> WriteError:
    """A one-line error for a failed write of ``path``: what, where, and what to do."""
    hint = _HINTS.get(exc.errno or 0, "check the path and retry")
    return WriteError(f"cannot write {path}: {exc.strerror or exc}; {hint}")


def _real(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(path))


def check_apart(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse an output that is, contains, or lies inside an input (real paths compared)."""
    ro = _real(out)
    for item in inputs:
        ri = _real(item)
        if ro == ri:
            raise OutputError(f"output {out} is the input {item}; choose another output path")
        if ro in ri.parents:
            raise OutputError(
                f"output {out} contains the input {item}; replacing it would delete the input: "
                "choose another output path"
            )
        if ri in ro.parents and ri.is_dir():
            raise OutputError(
                f"output {out} lies inside the input directory {item}; its files would be read as "
                "input next time: write it elsewhere"
            )


def is_varpack_output(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory varpack wrote (plan, sort output, or marked directory)."""
    p = Path(path)
    if not p.is_dir() or p.is_symlink():
        return False
    if (p / MARKER).is_file():
        return True
    for name, fmt in _OWN_INDEXES.items():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if json.loads((p / name).read_text()).get("format") == fmt:
                return True
    return False


def own_files(path: str | os.PathLike[str]) -> set[str] | None:
    """The files (relative paths) varpack wrote in its output directory ``path``, as its index
    lists them (plan.json's ranks, _index.json's parts, the marker's files); None when the
    index lists none (a marker written before markers listed their files)."""
    p = Path(path)
    for name, key in (("plan.json", "ranks"), ("_index.json", "parts")):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            index = json.loads((p / name).read_text())
            if index.get("format") == _OWN_INDEXES[name]:
                return {name, *(str(e["file"]) for e in index.get(key) or [])}
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        files = json.loads((p / MARKER).read_text()).get("files")
        if isinstance(files, list):
            return {MARKER, *map(str, files)}
    return None


def _escapes(name: str) -> bool:
    """Whether an index entry points outside its directory (absolute, or through ``..``).

    >>> _escapes("part-00000.parquet"), _escapes("../x"), _escapes("/etc/passwd")
    (False, True, True)
    """
    return os.path.isabs(name) or ".." in Path(name).parts


def foreign_files(path: str | os.PathLike[str]) -> list[str]:
    """Entries inside varpack's output directory that varpack did not write (sorted): files,
    links (never followed) and empty directories (``name/``)."""
    own = own_files(path)
    if own is None:
        return []
    root = Path(path)
    holders = {str(d) for f in own for d in Path(f).parents}  # the directories of own files
    found = []
    for where, dirs, files in os.walk(root):  # a link to a directory is listed, not entered
        rel = Path(where).relative_to(root)
        for name in dirs + files:
            entry, full = str(rel / name), Path(where) / name
            if entry in own or (entry in holders and not full.is_symlink()):
                continue
            if name in files or full.is_symlink():
                found.append(entry)
            elif not any(full.iterdir()):  # a non-empty one is named by what it holds
                found.append(entry + "/")
    return sorted(found)


def check_output(
    path: str | os.PathLike[str],
    overwrite: bool,
    inputs: Iterable[str | os.PathLike[str]] = (),
    owned: Callable[[Path], bool] = is_varpack_output,
) -> Path:
    """Fail early (before any work) when writing ``path`` is unsafe; see the module doc.

    ``owned(path)`` recognises an output of this command that ``--overwrite`` may replace; it is
    replaced only when it holds nothing but what varpack wrote there (its index's files).
    """
    out = Path(path)
    check_apart(out, inputs)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise OutputExistsError(f"output {out} already exists; pass --overwrite to replace it")
        if not owned(out):
            raise OutputError(
                f"output {out} exists and is not an output varpack wrote, so --overwrite will not "
                "replace it; remove it yourself or choose another output path"
            )
        outside = [f for f in own_files(out) or () if _escapes(f)] if out.is_dir() else []
        if outside:  # a damaged index: what else it names cannot be trusted either
            raise OutputError(
                f"output {out}: its index names {outside[0]!r}, outside the output, so it is "
                "damaged and --overwrite will not trust it; remove the output yourself"
            )
        foreign = foreign_files(out) if out.is_dir() else []
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise OutputError(
                f"output {out} holds files varpack did not write ({', '.join(foreign[:3])}{more}); "
                "--overwrite would delete them: move them out, or choose another output path"
            )
    clean_stale(out)
    return out


def temp_sibling(path: str | os.PathLike[str], token: str | None = None) -> Path:
    """A hidden temporary name next to ``path`` (same filesystem, so the final rename is atomic).

    ``token`` lets several MPI ranks agree on one name (rank 0 draws it and broadcasts it).
    """
    out = Path(path)
    token = token or uuid.uuid4().hex[:12]
    return out.parent / f".{out.name}.tmp-{token}"


def lock_of(tmp: Path) -> Path:
    return tmp.with_name(tmp.name + ".lock")


def new_temp(
    path: str | os.PathLike[str], token: str | None = None, directory: bool = True
) -> Path:
    """Create (a directory) or reserve (a file) a temporary for ``path``, locked by this process."""
    tmp = temp_sibling(path, token)
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "output": str(path)}
    try:
        lock_of(tmp).write_text(json.dumps(owner) + "\n")
        _LIVE.add(tmp)
        if directory:
            tmp.mkdir()
    except OSError as exc:
        drop_temp(tmp)
        raise write_error(path, exc) from None
    return tmp


def drop_temp(tmp: Path) -> None:
    """Remove a temporary and its lock."""
    remove(tmp)
    with contextlib.suppress(OSError):
        lock_of(tmp).unlink()
    _LIVE.discard(tmp)


def cleanup_live() -> None:
    """Remove every temporary this process still owns (on the way out after a signal)."""
    for tmp in list(_LIVE):
        drop_temp(tmp)


def _owner_gone(lock: Path) -> bool:
    try:
        owner = json.loads(lock.read_text())
    except (OSError, ValueError):
        return False
    if owner.get("host") != socket.gethostname():
        return False  # another machine's process: it cannot be checked from here
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, TypeError, ValueError):
        return False
    return False


def clean_stale(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries of ``path`` whose owner process is gone; returns what went."""
    out = Path(path)
    gone = []
    with contextlib.suppress(OSError):
        for lock in out.parent.glob(f".{out.name}.tmp-*.lock"):
            tmp = lock.with_name(lock.name.removesuffix(".lock"))
            if tmp not in _LIVE and _owner_gone(lock):
                drop_temp(tmp)
                gone.append(tmp)
    return gone


def publish(tmp: Path, path: str | os.PathLike[str], overwrite: bool) -> None:
    """Move the finished ``tmp`` onto ``path``, replacing an existing output only if allowed."""
    out = Path(path)
    try:
        if out.exists():
            if not overwrite:
                raise OutputExistsError(
                    f"output {out} already exists; pass --overwrite to replace it"
                )
            old = temp_sibling(out, "old-" + uuid.uuid4().hex[:8])
            os.replace(out, old)
            os.replace(tmp, out)
            remove(old)
        else:
            os.replace(tmp, out)
    except OSError as exc:
        raise write_error(out, exc) from None
    drop_temp(tmp)  # only the lock is left to remove


def remove(path: Path) -> None:
    """Remove a file or a directory tree, ignoring a missing one.

    A tree is removed in up to three passes: a file created inside it while it is being removed
    (by a writer not yet stopped) makes one pass leave the directory behind.
    """
    if path.is_dir() and not path.is_symlink():
        for _ in range(3):
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                break
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def make_parents(out: Path) -> list[Path]:
    """Create the missing parent directories of ``out``; returns them, deepest first."""
    made: list[Path] = []
    parent = out.parent
    while not parent.exists():
        made.append(parent)
        parent = parent.parent
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(out, exc) from None
    return made


def remove_parents(made: list[Path]) -> None:
    """Remove directories :func:`make_parents` created, if they are still empty."""
    for d in made:
        with contextlib.suppress(OSError):
            d.rmdir()


@contextlib.contextmanager
def atomic_dir(
    path: str | os.PathLike[str],
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
    marker: str | None = None,
) -> Iterator[Path]:
    """Yield a fresh temporary directory; publish it as ``path`` on success, delete it on failure.

    ``marker``: write :data:`MARKER` naming this kind of output, so that a later ``--overwrite``
    may replace it (outputs with an index of their own, plan.json or _index.json, need none).

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_dir(root / "out") as tmp:
    ...     _ = (tmp / "a.txt").write_text("x")
    >>> sorted(p.name for p in (root / "out").iterdir()), sorted(p.name for p in root.iterdir())
    (['a.txt'], ['out'])
    """

    def mark(tmp: Path) -> None:
        if marker is not None:  # the files it lists are what a later --overwrite may replace
            files = sorted(str(f.relative_to(tmp)) for f in tmp.rglob("*") if not f.is_dir())
            index = {"format": f"varpack.{marker}", "files": files}
            (tmp / MARKER).write_text(json.dumps(index) + "\n")

    with _atomic(path, overwrite, inputs, is_varpack_output, True, mark) as tmp:
        yield tmp


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str],
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
    owned: Callable[[Path], bool] = is_varpack_output,
) -> Iterator[Path]:
    """Yield a temporary file name next to ``path``; publish it as ``path`` on success.

    On failure the temporary file (if the block created it) is removed and ``path`` is untouched.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_file(root / "a.bin") as tmp:
    ...     _ = tmp.write_bytes(b"x")
    >>> sorted(p.name for p in root.iterdir())
    ['a.bin']
    """
    with _atomic(path, overwrite, inputs, owned, False, lambda tmp: None) as tmp:
        yield tmp


@contextlib.contextmanager
def _atomic(
    path: str | os.PathLike[str],
    overwrite: bool,
    inputs: Iterable[str | os.PathLike[str]],
    owned: Callable[[Path], bool],
    directory: bool,
    finish: Callable[[Path], None],
) -> Iterator[Path]:
    """Check, make the parents and a locked temporary, yield it, ``finish`` it and publish it; on
    any failure remove the temporary and the parents made, an OS error becoming one line."""
    out = check_output(path, overwrite, inputs, owned)
    made = make_parents(out)
    tmp = new_temp(out, directory=directory)
    try:
        yield tmp
        finish(tmp)
        publish(tmp, out, overwrite)
    except BaseException as exc:
        drop_temp(tmp)
        remove_parents(made)
        if isinstance(exc, OSError):
            raise write_error(out, exc) from None
        raise


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write one file atomically (temporary name in the same directory, then rename)."""
    out = Path(path)
    tmp = new_temp(out, directory=False)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, out)
    except OSError as exc:
        raise write_error(out, exc) from None
    finally:
        drop_temp(tmp)


_PENDING: list[int] = []  # signals raised (one raised in a C callback was swallowed there)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    if deferred(signum, frame):  # inside numba's own code: sent again, raised a line later
        return
    for name in _SIGNALS:  # a second signal must not interrupt the cleanup of the first
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    _PENDING.append(signum)
    raise Interrupted(signum)


def check_interrupted() -> None:
    """Raise :class:`Interrupted` for a signal that arrived where its exception could not
    propagate (a C callback swallowed it)."""
    if _PENDING:
        raise Interrupted(_PENDING[0])


def _unraisable(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    """An unraisable hook that drops a swallowed :class:`Interrupted` (raised again later)."""

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            previous(unraisable)

    return hook


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within the block, SIGTERM, SIGINT and SIGHUP raise :class:`Interrupted` (main thread)."""
    try:
        saved: dict[str, Any] = {
            name: signal.signal(getattr(signal, name), _raise_interrupted) for name in _SIGNALS
        }
    except ValueError:  # not the main thread: leave the handlers alone
        saved = {}
    hook = sys.unraisablehook
    sys.unraisablehook = _unraisable(hook)
    try:
        yield
    except Interrupted:
        cleanup_live()
        raise
    finally:
        for name, old in saved.items():
            signal.signal(getattr(signal, name), old)
        sys.unraisablehook = hook
        _PENDING.clear()
