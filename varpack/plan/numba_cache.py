"""numba's on-disk cache of the planner's kernels, keyed to varpack's version and sources.

numba (``cache=True``) keeps a compiled kernel with the hash of the file that defines it, so a
kernel whose callee (or a constant it reads) lives in another file replays its old machine code
after that file changed. Here every kernel defined under ``varpack/plan/`` is kept with one key
instead: varpack's version and the text of every module of ``varpack/plan/`` and of the modules
it may import (``errors``, ``fingerprint``), hashed at import (about 2 ms); any change there
compiles every planner kernel again, once. Kernels elsewhere in varpack call only kernels of
their own file (``tests/plan/test_numba_cache.py`` checks it), which numba's own key covers.

:func:`install` (run by ``varpack/plan/__init__.py``, before any kernel is defined) puts the key
into numba's cache locators for the planner's files, wherever numba keeps the cache
(``__pycache__`` beside the sources, ``NUMBA_CACHE_DIR``, or the user's cache directory when the
install is read-only). :func:`cached` says whether a kernel module's cache holds the current key
(the test suite's warm-up uses it); :func:`announce_compiles` says, once per process, that a
call is about to compile kernels, so that a first call never stalls silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import pickle
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from numba.core import caching, event

import varpack

logger = logging.getLogger(__name__)

PLAN = Path(__file__).resolve().parent
#: the modules the planner may import (``varpack.plan``'s docstring): their constants too
IMPORTED = ("errors.py", "fingerprint.py")


def sources(plan: Path = PLAN) -> list[Path]:
    """The files the kernels' key hashes: every module of ``plan`` and those it may import."""
    return sorted(plan.rglob("*.py")) + [plan.parent / name for name in IMPORTED]


def cache_key(version: str, plan: Path = PLAN) -> str:
    """``VERSION:SHA256`` of the version and of each source file's path (under the package)
    and text: equal for the same sources, different when any of them changes."""
    h = hashlib.sha256(version.encode() + b"\0")
    for path in sources(plan):
        h.update(path.relative_to(plan.parent).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return f"{version}:{h.hexdigest()}"


@cache
def key() -> str:
    """This install's key (computed once per process)."""
    return cache_key(varpack.__version__)


class _Keyed:
    """Mixed into each of numba's file-backed locators: the planner's files only, stamped with
    :func:`key` rather than their own file's hash."""

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> Any:
        if not Path(py_file).resolve().is_relative_to(PLAN):
            return None  # numba's own locators take it
        return super().from_function(py_func, py_file)  # type: ignore[misc]

    def get_source_stamp(self) -> str:
        return key()


def _impl() -> Any:
    """numba's cache implementation (named ``_CacheImpl`` by older numba)."""
    return getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")  # noqa: B009


def install() -> None:
    """Put a keyed locator before each of numba's file-backed ones (once)."""
    impl = _impl()
    if any(issubclass(c, _Keyed) for c in impl._locator_classes):
        return
    mixin = caching._SourceFileBackedLocatorMixin
    keyed = [
        type(f"Varpack{c.__name__.lstrip('_')}", (_Keyed, c), {})
        for c in impl._locator_classes
        if issubclass(c, mixin)
    ]
    impl._locator_classes = [*keyed, *impl._locator_classes]


def cached(index: Path) -> bool:
    """Whether numba's index file ``index`` (``*.nbi``) was written under the current key."""
    try:
        with index.open("rb") as f:
            pickle.load(f)  # numba's version (numba checks it itself)
            stamp, _ = pickle.loads(f.read())
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError):
        return False
    return bool(stamp == key())


class _Announce(event.Listener):  # type: ignore[misc]
    said = False  # once per process

    def __init__(self, message: str) -> None:
        self.message = message

    def on_start(self, ev: event.Event) -> None:
        if _Announce.said:
            return
        module = getattr(ev.data["dispatcher"].py_func, "__module__", "") or ""
        if module.startswith("varpack."):
            _Announce.said = True
            logger.warning(self.message)

    def on_end(self, ev: event.Event) -> None:
        pass


def expect_compiles() -> None:
    """No announcement in this process: its compilation is what was asked for."""
    _Announce.said = True


@contextlib.contextmanager
def announce_compiles(message: str) -> Iterator[None]:
    """Inside: the first compilation of a varpack kernel in this process logs ``message`` (a
    warning of logger ``varpack.plan.numba_cache``: on stderr where logging is not set up)."""
    if _Announce.said:
        yield
        return
    with event.install_listener("numba:compile", _Announce(message)):
        yield
