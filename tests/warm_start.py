"""Start a script's ranks from a process that imported it already: a test's fork server.

A trainer rank pays about 5 CPU-seconds before its first step, most of it imports (torch, its
compiler stack, which the first optimizer imports, numba's kernels), and a test of the trainer's
behaviour runs it a few times on 2 to 4 ranks. :class:`WarmStart` starts one server per script
(``python warm_start.py SCRIPT``) that imports what the script imports, once; each rank is then
a fork of it that runs ``SCRIPT`` as ``__main__`` with its own argv, environment (the launcher's
variables), working directory, stdout and stderr, in a session of its own, exactly as a fresh
``python SCRIPT ARGS`` would from there on. What a fresh interpreter does differently (reading
``OMP_NUM_THREADS`` at import: the server starts with the first caller's, one thread) no test
of the trainer's behaviour depends on: a launch is its variables, a signal reaches the rank's
own session; torchrun's tests (a launcher that starts its own workers) start fresh interpreters.

The server reads each request (JSON, with the rank's stdout and stderr as file descriptors)
from a Unix socket on its stdin and answers ``{"pid": P}``, then
``{"exit": P, "code": C}`` when that rank ends (``C`` as ``Popen.returncode``: ``-N`` for a
signal). It ends, and kills the ranks still running, when its stdin closes (the test process
is gone).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any


def _run(req: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``python SCRIPT ARGS`` and never return."""
    code = 1
    try:
        os.setsid()
        for fd, target in zip([os.open(os.devnull, os.O_RDONLY), *fds], (0, 1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.argv = [req["script"], *req["args"]]
        runpy.run_path(req["script"], run_name="__main__")
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            sys.stderr.write(f"{exc.code}\n")
    except BaseException:  # as the interpreter would: the traceback, exit 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(script: str) -> None:
    sys.path[0] = str(Path(script).parent)  # as `python SCRIPT` has it
    runpy.run_path(script, run_name="__warm__")  # its imports; its main guard keeps it idle
    if "torch" in sys.modules:
        import torch._dynamo  # noqa: F401  (imported by every optimizer's first step)
    chan = socket.socket(fileno=0)  # a socket pair's end: requests, with the rank's fds
    live: set[int] = set()

    def say(msg: dict[str, int]) -> None:
        os.write(1, (json.dumps(msg) + "\n").encode())

    while True:
        ready, _, _ = select.select([chan], [], [], 0.05)
        while live:  # reap the ranks that ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            live.discard(pid)
            say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if not ready:
            continue
        msg, fds, _, _ = socket.recv_fds(chan, 1 << 20, 2)
        if not msg:
            break
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            chan.close()
            _run(json.loads(msg), fds)
        for fd in fds:  # the rank holds them now: its pipes end with it
            os.close(fd)
        live.add(pid)
        say({"pid": pid})
    for pid in live:  # the test process is gone: so are its ranks
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Rank:
    """One forked rank, as much of ``subprocess.Popen`` as the tests use: ``stdout`` and
    ``stderr`` are pipes (text) unless they went to files."""

    def __init__(self, server: WarmStart, pid: int, args: list[str],
                 pipes: list[int | None]) -> None:  # fmt: skip
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None
        self.stdout, self.stderr = (None if fd is None else open(fd) for fd in pipes)  # noqa: SIM115
        self._read: dict[str, list[str]] = {}
        self._readers: list[threading.Thread] = []

    def poll(self) -> int | None:
        self.returncode = self.server.codes.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.server.changed:
            if not self.server.changed.wait_for(lambda: self.pid in self.server.codes, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.poll()  # type: ignore[return-value]

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """All of stdout and stderr, once the rank ended (``TimeoutExpired`` if not in time;
        call it again later, as with ``Popen``)."""
        if not self._readers:
            for name in ("stdout", "stderr"):
                stream, got = getattr(self, name), self._read.setdefault(name, [])
                if stream is not None:
                    self._readers.append(threading.Thread(
                        target=lambda s=stream, g=got: g.append(s.read()), daemon=True))  # fmt: skip
                    self._readers[-1].start()
        end = None if timeout is None else time.monotonic() + timeout
        for t in self._readers:
            t.join(None if end is None else max(end - time.monotonic(), 0))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if end is None else max(end - time.monotonic(), 0))
        return "".join(self._read["stdout"]), "".join(self._read["stderr"])

    def __enter__(self) -> Rank:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


class WarmStart:
    """The fork server of one script (see the module's docstring); ``start`` forks a rank."""

    def __init__(self, script: Path, env: dict[str, str]) -> None:
        self.chan, theirs = socket.socketpair(type=socket.SOCK_SEQPACKET)  # one request a message
        self.proc = subprocess.Popen([sys.executable, __file__, str(script)], env=env,
                                     stdin=theirs.fileno(), stdout=subprocess.PIPE,
                                     cwd=Path(script).parent, start_new_session=True)  # fmt: skip
        theirs.close()
        self.codes: dict[int, int] = {}
        self.pids: list[int] = []
        self.dead = False
        self.changed = threading.Condition()
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.changed:
                if "pid" in msg:
                    self.pids.append(msg["pid"])
                else:
                    self.codes[msg["exit"]] = msg["code"]
                self.changed.notify_all()
        with self.changed:  # the server died: nothing it started will report
            self.dead = True
            self.changed.notify_all()

    def start(self, script: Path, args: list[str], env: dict[str, str], cwd: Path,
              out: Path | None = None, err: Path | None = None) -> Rank:  # fmt: skip
        """``python SCRIPT ARGS`` forked, its stdout and stderr to these files, else pipes."""
        req = {"script": str(script), "args": args, "env": env, "cwd": str(cwd)}
        theirs: list[int] = []
        ours: list[int | None] = []
        for path in (out, err):
            if path is None:
                r, w = os.pipe()
                theirs.append(w)
                ours.append(r)
            else:
                theirs.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
                ours.append(None)
        assert self.proc.poll() is None, "the server is gone"
        with self.changed:
            n = len(self.pids)
            socket.send_fds(self.chan, [json.dumps(req).encode()], theirs)
            for fd in theirs:
                os.close(fd)
            self.changed.wait_for(lambda: len(self.pids) > n or self.dead)
            assert len(self.pids) > n, "the server died before it started the rank"
            return Rank(self, self.pids[n], [str(script), *args], ours)

    def close(self) -> None:
        self.chan.close()
        self.proc.wait()


_servers: dict[tuple[str, str], WarmStart] = {}


def warm_start(script: Path, env: dict[str, str]) -> WarmStart:
    """This process's server for ``script`` (started with ``env``'s thread count and path)."""
    key = (str(script), env.get("OMP_NUM_THREADS", ""))
    if key not in _servers or _servers[key].proc.poll() is not None:
        _servers[key] = WarmStart(script, env)
    return _servers[key]


@atexit.register
def _close_all() -> None:
    for server in _servers.values():
        server.close()


if __name__ == "__main__":
    serve(sys.argv[1])
