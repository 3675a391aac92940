"""Every wait for the other ranks has a deadline, and a signal ends it within seconds.

A rank of a distributed job waits for the others at a few points: the rendezvous
(``init_process_group``), the set-up check every rank takes part in, the stop flag agreed after
each step, the barrier after a checkpoint, the final figures. Each runs inside
:func:`waiting`, and a thread of the process (:class:`Watch`) keeps the deadlines:

- Python runs a signal handler between bytecodes only, so a rank blocked in a collective (C++)
  would not see SIGTERM before the collective ends, which may be never. The C-level handler also
  writes the signal's number to a socket (``signal.set_wakeup_fd``): the watch reads it at once.
- A wait that lasts ``timeout`` seconds ends the process: one line naming the wait, exit 1.
- Before the first step (the rendezvous, the set-up) a signal ends the process at once: there is
  nothing to save.
- From the first step on, a signal gives each rank ``grace`` seconds to finish its step and
  reach the agreement; a rank still held after that (a peer stuck or gone) stops at once. Once
  the ranks have agreed to stop, each later wait (checkpoint barrier, final figures) gets
  ``grace`` seconds of its own. ``grace`` is 10 s plus twice the longest stretch seen so far
  (a step, a save, a wait), at most ``timeout``: the others are late only when they are later
  than anything before.
- A second signal a second or more after the first stops at once (one ``kill`` may reach a
  process twice, through its process group and its launcher, a moment apart).
- A signal restarts the system call it interrupts (``SA_RESTART``): torch's socket calls would
  fail on ``EINTR`` and print a C++ stack trace; the watch acts instead.

A thread cannot interrupt a collective, so each of these ends with ``os._exit`` after one line
(stdout for a signal, stderr for a timeout; also torchelastic's error file). Rank 0 alone
speaks before the first step, except at the rendezvous, where rank 0 may be the one missing.
A rank saving a checkpoint (:meth:`Watch.holding`) is never cut short. A collective that fails
inside a wait (a peer's connection closed) is :class:`LostRanks`, exit 1.

Imports: ``varpack.errors``, ``varpack.torch.launch`` (no torch).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import NoReturn

from varpack.errors import VarpackError
from varpack.torch.launch import record_error

#: seconds a signal leaves a rank to end its step, before the longest stretch is added
GRACE = 10.0
#: a signal this many seconds after the first is a second one (closer: the same one twice)
SECOND = 1.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_active: Watch | None = None
_forked_hook = False


class LostRanks(VarpackError):
    """A collective failed: another rank is gone (its own output says why). Exit 1."""

    exit_code = 1


def waiting(what: str, hint: str = "", everyone: bool = False) -> AbstractContextManager[None]:
    """The watched wait ``what`` (e.g. "the step's stop flag") of the running :class:`Watch`;
    nothing where none runs (one process, a test)."""
    return _active.waiting(what, hint, everyone) if _active is not None else nullcontext()


def holding() -> AbstractContextManager[None]:
    """Work that must not be cut short (a checkpoint being written) under the running watch."""
    return _active.holding() if _active is not None else nullcontext()


def backend_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective's failure (gloo and NCCL raise plain ``RuntimeError``)."""
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return type(exc).__name__.startswith("Dist") or any(
        w in text for w in ("gloo", "NCCL", "Connection closed", "Connection reset", "timed out")
    )


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def gone(exc: BaseException) -> str:
    """What a failed collective says of the other ranks: one closed its connection (it ended;
    its own output says why), or nothing more is known."""
    closed = any(w in str(exc) for w in ("Connection closed", "Connection reset", "Broken pipe"))
    return ": another rank is gone (its own output says why)" if closed else ""


class Watch:
    """The deadlines of one process's waits, and its signals (see the module's docstring).
    ``kept`` says what an early stop leaves ("OUT/checkpoint.pt holds step 4; resume with
    --resume"); ``step`` counts the optimizer steps done. Start it from the main thread."""

    def __init__(self, timeout: float, rank: int, world: int, tag: str = "[train]") -> None:
        self.timeout, self.rank, self.world, self.tag = timeout, rank, world, tag
        self.kept = "nothing to save; start it again"
        self.step = 0
        self._lock = threading.RLock()
        self._what: str | None = None
        self._hint, self._everyone, self._since = "", False, 0.0
        self._training = self._agreed = self._closed = False
        self._holding = 0
        self._signum, self._signal_at, self._released = 0, 0.0, 0.0
        self._longest, self._last = 0.0, 0.0
        self._rsock, self._wsock = socket.socketpair()
        self._old_fd = -1
        self._thread = threading.Thread(target=self._run, name="varpack-watch", daemon=True)

    def start(self) -> Watch:
        global _active
        for sock in (self._rsock, self._wsock):
            sock.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        for sig in _SIGNALS:  # a signal restarts the call it lands in (torch's connect and recv
            signal.siginterrupt(sig, False)  # log a stack trace when one fails with EINTR)
        _forget_in_children()
        self._thread.start()
        _active = self
        return self

    def close(self) -> None:
        global _active
        _active = None
        with self._lock:
            self._closed = True
        signal.set_wakeup_fd(self._old_fd)
        self._thread.join(timeout=1.0)
        self._rsock.close()
        self._wsock.close()

    def training(self) -> None:
        """The first step begins: from now on a signal leaves time to finish a step."""
        with self._lock:
            self._training, self._last = True, time.monotonic()

    def agreed(self) -> None:
        """Every rank knows of the signal and stops after this step: each wait left gets
        ``grace`` seconds of its own."""
        with self._lock:
            self._agreed = True

    @contextmanager
    def waiting(self, what: str, hint: str = "", everyone: bool = False) -> Iterator[None]:
        now = time.monotonic()
        with self._lock:
            if self._training:
                self._longest = max(self._longest, now - self._last)
            self._what, self._hint, self._everyone, self._since = what, hint, everyone, now
        try:
            yield
        except RuntimeError as exc:
            if not backend_error(exc):
                raise
            raise LostRanks(f"{self._who()}{what} failed ({first_line(exc)}){gone(exc)}; "
                            f"{self.kept}") from None  # fmt: skip
        finally:
            now = time.monotonic()
            with self._lock:
                self._longest = max(self._longest, now - self._since) if self._training else 0.0
                self._what, self._last = None, now

    @contextmanager
    def holding(self) -> Iterator[None]:
        with self._lock:
            self._holding += 1
        try:
            yield
        finally:
            with self._lock:  # the deadlines count from here: the save was not late
                self._holding -= 1
                self._released = time.monotonic()
            self._check(self._released)

    def grace(self) -> float:
        return min(self.timeout, GRACE + 2 * self._longest)

    def _run(self) -> None:
        while not self._closed:
            try:
                ready, _, _ = select.select([self._rsock], [], [], 0.2)
                data = self._rsock.recv(64) if ready else b""
            except (OSError, ValueError):  # closed under us: the watch is over
                return
            for sig in data:
                if sig in _SIGNALS:
                    self._signalled(sig)
            self._check(time.monotonic())

    def _signalled(self, sig: int) -> None:
        now = time.monotonic()
        with self._lock:
            if not self._signum:
                self._signum, self._signal_at = sig, now
            elif now - self._signal_at >= SECOND and not self._holding:
                name = signal.Signals(sig).name
                self._say(f"interrupted ({name} twice): stopped at once; {self.kept}", 128 + sig)

    def _check(self, now: float) -> None:
        with self._lock:
            if self._closed or self._holding:
                return
            what, sig = self._what, self._signum
            name, code = (signal.Signals(sig).name if sig else ""), 128 + sig
            if sig and not self._training:
                if self.rank == 0 or self._everyone:
                    where = f"at {what}" if what else "before the first step"
                    self._say(f"interrupted ({name}) {where}: {self.kept}", code)
                self._leave(code)
            since_signal = now - max(self._signal_at, self._released)
            if sig and not self._agreed and since_signal >= self.grace():
                self._say(f"interrupted ({name}): step {self.step + 1} did not end within "
                          f"{self.grace():.0f}s of the signal (a rank is stuck or gone): "
                          f"stopped at once; {self.kept}", code)  # fmt: skip
            if sig and what and min(since_signal, now - self._since) >= self.grace():
                self._say(f"interrupted ({name}): the other ranks did not reach {what} within "
                          f"{self.grace():.0f}s: stopped at once; {self.kept}", code)  # fmt: skip
            if what and not sig and now - self._since >= self.timeout:
                hint = self._hint or "a rank is gone or stuck (its own output says why)"
                self._say(f"varpack: error: {self._who()}no word from the other ranks in "
                          f"{self.timeout:g}s at {what}: {hint}; {self.kept}; raise --timeout if "
                          "this wait may take longer", 1, error=True)  # fmt: skip

    def _who(self) -> str:
        return f"rank {self.rank}: " if self.world > 1 else ""

    def _say(self, line: str, code: int, error: bool = False) -> NoReturn:
        _flush()
        if not error:
            line = f"{self.tag} {self._who()}{line}"
        os.write(2 if error else 1, (line + "\n").encode())  # one write: ranks share the stream
        record_error(line)
        os._exit(code)

    @staticmethod
    def _leave(code: int) -> NoReturn:
        _flush()
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _forget_in_children() -> None:
    """A forked child (a DataLoader worker) must not write its signals to the parent's socket:
    a Ctrl-C to the process group would reach the watch twice, as a second signal."""
    global _forked_hook
    if not _forked_hook:
        os.register_at_fork(after_in_child=_child)
        _forked_hook = True


def _child() -> None:
    global _active
    _active = None
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from another thread: the child has no main thread to reset
        pass


__all__ = ["LostRanks", "Watch", "backend_error", "first_line", "gone", "holding", "waiting"]
