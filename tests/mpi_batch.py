"""Many ``varpack`` commands in one MPI job, so that a test module pays each rank's start-up once.

    mpiexec -n N python -m mpi4py tests/mpi_batch.py WORKDIR

A rank of ``mpiexec ... python -m mpi4py -m varpack`` spends about a second importing numpy,
pyarrow and numba and loading the planner's cached kernels, for a test plan that takes
milliseconds. :func:`mpiexec_many` (the tests' side) writes ``WORKDIR/cases.json`` (each case's
arguments and the environment variables it sets) and starts one job per rank count; every rank
runs each case in turn, in-process, as ``python -m varpack ARGS`` would (``varpack.cli.main``), its
stdout and stderr redirected at the file descriptors into ``WORKDIR/K/R.out`` and ``R.err`` (case
``K``, rank ``R``), and writes its exit code and seconds to ``R.code`` once every rank is through
the case. ``WORKDIR/prelude.py``, if there, runs first on every rank: a test's patch of the
planner, for every case of the job, or for the cases that set an environment variable it reads
(it may wrap ``varpack.cli.main``, which each case calls as the prelude left it).

A failure that the ranks agree on (a refusal) ends the case, not the job: ``agreed_exit``, which
in a job of its own ends every rank by rank 0's ``Abort(code)`` so that mpiexec passes the code
on, here raises ``SystemExit(code)`` on every rank after the same ``Barrier``, and the code is the
one that ``Abort`` would have carried (the line was printed before; MPI's banner is silenced
there anyway). The tests that launch failing commands in separate processes check the ``Abort``
path itself (``test_plan_mpi.py::test_failures_are_agreed`` also checks that a batch gives what
they give). Anything else that ends a rank (a signal, an uncaught error, an ``Abort``, a hang
until the timeout) ends the job: the cases it did not finish, and a case whose ranks exit with
different codes, run again, each in its own ``mpiexec``, which then gives the test the real
outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
DRIVER = Path(__file__).resolve()

#: ``(ranks, args)`` or ``(ranks, args, env)``: the environment variables the case sets
Case = tuple[int, Sequence[object]] | tuple[int, Sequence[object], Mapping[str, str]]


@dataclass
class Ran:
    """What one ``mpiexec`` of a case gives: its exit code, the ranks' stdout and stderr (in
    rank order), and the seconds it took (the slowest rank's, in a batch)."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _sets(case: Case) -> dict[str, str]:
    """The environment variables a case sets."""
    return dict(case[2]) if len(case) > 2 else {}  # type: ignore[misc]


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return dict(os.environ, PATH=path, PYTHONUNBUFFERED="1", **(extra or {}))


def _mpiexec(ranks: int) -> list[str]:
    exe = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
    assert exe, "mpiexec not found; run `make install`"
    return [exe, "-n", str(ranks), sys.executable, "-m", "mpi4py"]


def mpiexec_many(
    cases: Sequence[Case], work: Path, timeout: float = 300, prelude: str | None = None
) -> list[Ran]:
    """Run each case as ``mpiexec -n RANKS python -m mpi4py -m varpack ARGS`` would, one job per
    rank count (``prelude``: code every rank runs first); a case the job did not finish runs
    again on its own (its script the prelude, then ``varpack.cli.main``). The jobs run in the
    order their rank counts first appear in ``cases``, each its cases in order, so what a case
    writes (a sort's output) can serve the cases after it. Results in the order of ``cases``."""
    results: dict[int, Ran] = {}
    for ranks in dict.fromkeys(c[0] for c in cases):  # in the order they first appear
        index = [k for k, c in enumerate(cases) if c[0] == ranks]
        job = work / f"ranks{ranks}"
        job.mkdir(parents=True)
        if prelude is not None:
            (job / "prelude.py").write_text(prelude)
        todo = [[[str(a) for a in cases[k][1]], _sets(cases[k])] for k in index]
        (job / "cases.json").write_text(json.dumps(todo))
        try:
            subprocess.run([*_mpiexec(ranks), str(DRIVER), str(job)], capture_output=True,
                           timeout=timeout, env=_env())  # fmt: skip
        except subprocess.TimeoutExpired:
            pass  # the unfinished cases run again, each with its own timeout
        for j, k in enumerate(index):
            results[k] = _read(job / str(j), ranks) or _alone(cases[k], timeout, job)
    return [results[k] for k in range(len(cases))]


def _read(case: Path, ranks: int) -> Ran | None:
    """A case every rank finished with the same exit code, as one mpiexec reports it."""
    ends = [case / f"{r}.code" for r in range(ranks)]
    if not all(end.exists() for end in ends):
        return None
    codes, seconds = zip(*(end.read_text().split() for end in ends), strict=True)
    if len(set(codes)) != 1:
        return None
    out, err = (
        "".join((case / f"{r}.{s}").read_text() for r in range(ranks)) for s in ("out", "err")
    )
    return Ran(int(codes[0]), out, err, max(map(float, seconds)))


def _alone(case: Case, timeout: float, job: Path) -> Ran:
    """The case in an mpiexec of its own (after the job's prelude, if it has one)."""
    cmd = [*_mpiexec(case[0]), "-m", "varpack"]
    if (job / "prelude.py").exists():
        script = job / "alone.py"
        main = "\nimport sys\nfrom varpack.cli import main\nmain(sys.argv[1:])\n"
        script.write_text((job / "prelude.py").read_text() + main)
        cmd[-2:] = [str(script)]
    cmd += [str(a) for a in case[1]]
    env = _env(_sets(case))
    start = time.monotonic()
    try:
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        return Ran(-9, str(exc.stdout or ""), f"timed out: {exc}", time.monotonic() - start)
    return Ran(got.returncode, got.stdout, got.stderr, time.monotonic() - start)


# --- the job's side ------------------------------------------------------------------------------


def _case_exit(code: int) -> None:
    """``agreed_exit`` inside a batch: every rank has printed its line; the case ends on every
    rank with the code ``Abort`` would have given mpiexec."""
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    MPI.COMM_WORLD.Barrier()
    sys.exit(code)


def _run(args: list[str], out: Path, err: Path) -> int:
    """``python -m varpack ARGS`` in this process, its output in ``out`` and ``err``."""
    from mpi4py import MPI

    from varpack.cli import main

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    code: Any = 0
    with open(out, "wb") as o, open(err, "wb") as e:
        os.dup2(o.fileno(), 1)
        os.dup2(e.fileno(), 2)
        try:
            main(args, prog_name="python -m varpack")
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # as mpi4py's runner does: the traceback, then end every rank
            traceback.print_exc()
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    if code is None or isinstance(code, int):
        return code or 0
    with open(err, "a") as e:  # sys.exit("text"): the text is printed, the exit code is 1
        e.write(f"{code}\n")
    return 1


def serve(job: Path) -> None:
    """Run every case of ``job/cases.json`` on this rank (see the module's docstring)."""
    from mpi4py import MPI

    import varpack.sort.agree

    if (job / "prelude.py").exists():
        exec(compile((job / "prelude.py").read_text(), str(job / "prelude.py"), "exec"), {})
    varpack.sort.agree.agreed_exit = _case_exit
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    for k, (args, env) in enumerate(json.loads((job / "cases.json").read_text())):
        case = job / str(k)
        if rank == 0:
            case.mkdir()
        kept = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        comm.Barrier()
        start = time.monotonic()
        code = _run(args, case / f"{rank}.out", case / f"{rank}.err")
        seconds = time.monotonic() - start
        comm.Barrier()  # the case is over on every rank before its codes say so
        for name, value in kept.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        (case / f"{rank}.code").write_text(f"{code} {seconds:.3f}")


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
