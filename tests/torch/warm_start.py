"""Start a script's ranks from a process that imported it already: a test's fork server.

A trainer rank pays about 5 CPU-seconds before its first step, most of it imports (torch, its
compiler stack, which the first optimizer imports, numba's kernels), and a test of the trainer's
behaviour runs it a few times on 2 to 4 ranks. :class:`WarmStart` starts one server per script
(``python warm_start.py SCRIPT``) that imports what the script imports, once; each rank is then
a fork of it that runs ``SCRIPT`` as ``__main__`` with its own argv, environment (the launcher's
variables), working directory, stdout and stderr, in a session of its own, exactly as a fresh
``python SCRIPT ARGS`` would from there on. What a fresh interpreter does differently (reading
``OMP_NUM_THREADS`` at import: the server starts with one thread, as ``ranks`` gives every
rank) no test of the trainer's behaviour depends on; the tests of the launch itself (srun,
torchrun, signals in the rendezvous) start real processes.

The server reads one JSON request a line on stdin and answers ``{"pid": P}``, then
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
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any


def _run(req: dict[str, Any]) -> None:
    """In the forked child: become ``python SCRIPT ARGS`` and never return."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
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
    live: set[int] = set()

    def say(msg: dict[str, int]) -> None:
        os.write(1, (json.dumps(msg) + "\n").encode())

    stdin = os.fdopen(0, "rb", buffering=0)
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.05)
        while live:  # reap the ranks that ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            live.discard(pid)
            say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if not ready:
            continue
        line = stdin.readline()
        if not line:
            break
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run(json.loads(line))
        live.add(pid)
        say({"pid": pid})
    for pid in live:  # the test process is gone: so are its ranks
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Rank:
    """One forked rank, as much of ``subprocess.Popen`` as ``ranks`` uses."""

    def __init__(self, server: WarmStart, pid: int) -> None:
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        self.returncode = self.server.codes.get(self.pid)
        return self.returncode

    def wait(self) -> int:
        with self.server.changed:
            self.server.changed.wait_for(lambda: self.pid in self.server.codes)
        return self.poll()  # type: ignore[return-value]


class WarmStart:
    """The fork server of one script (see the module's docstring); ``start`` forks a rank."""

    def __init__(self, script: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, str(script)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=Path(script).parent, start_new_session=True)  # fmt: skip
        self.codes: dict[int, int] = {}
        self.pids: list[int] = []
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
              out: Path, err: Path) -> Rank:  # fmt: skip
        req = {"script": str(script), "args": args, "env": env, "cwd": str(cwd),
               "out": str(out), "err": str(err)}  # fmt: skip
        assert self.proc.stdin is not None and self.proc.poll() is None, "the server is gone"
        with self.changed:
            n = len(self.pids)
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            self.changed.wait_for(lambda: len(self.pids) > n or getattr(self, "dead", False))
            assert len(self.pids) > n, "the server died before it started the rank"
            return Rank(self, self.pids[n])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
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
