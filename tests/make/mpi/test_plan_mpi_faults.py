"""``varpack plan`` under ``mpiexec`` when a run ends early: a signal to mpiexec while the ranks
plan, one rank failing while it writes its part, and MPI's shared memory after ranks that exit on
an agreed error. Every rank stops, nobody hangs, nothing is left behind.

Each case keeps a launch of its own (not the batched jobs of ``tests/mpi_batch.py``); the
byte-for-byte plans and the agreed refusals are in ``test_plan_mpi.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from testkit import BIN, cli, mpiexec, write_shards

pytestmark = pytest.mark.mpi


def _unmapped_segments() -> set[str]:
    """MPICH's segments in /dev/shm that no live process maps (leftovers)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(
                ln.split()[-1] for ln in maps.read_text().splitlines() if "/dev/shm/" in ln
            )
        except (OSError, IndexError):
            continue
    return {str(p) for p in Path("/dev/shm").glob("mpich_shm_*")} - mapped


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this system")
def test_a_failed_plan_leaves_no_shared_memory(tmp_path: Path) -> None:
    """The ranks unlink MPI's segments at start-up (as the sort does): a plan whose ranks exit
    on an agreed error leaves none in /dev/shm."""
    write_shards(tmp_path / "meta", np.arange(500), np.full(500, 900), [500])
    cli("sort", tmp_path / "meta", tmp_path / "sorted", "-q")
    before = _unmapped_segments()
    got = mpiexec(3, "plan", tmp_path / "sorted", tmp_path / "out", "--max-tokens", 512,
                  check=False)  # fmt: skip
    assert got.returncode == 2 and "do not fit --max-tokens 512" in got.stderr
    assert _unmapped_segments() - before == set()


@pytest.fixture(scope="module")
def big_sorted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 M samples, sorted into a single file (the two signals' input)."""
    top = tmp_path_factory.mktemp("big")
    cli("synth", top / "meta", "-n", "3M", "--shards", 2, "-q")
    cli("sort", top / "meta", top / "sorted", "--single-file", "-q")
    return top / "sorted"


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_under_mpi_leaves_nothing(
    big_sorted: Path, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """SIGTERM or Ctrl-C to mpiexec while the ranks plan: every rank stops, one line per rank
    the signal reached, the partial plan removed."""
    sorted_out, out = big_sorted, tmp_path / "plan"
    mpi = [str(BIN / "mpiexec"), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "varpack"]
    cmd = [*mpi, "plan", str(sorted_out), str(out), "--max-tokens", "65536", "--dp", "8",
           "--oversize", "split", "-q"]  # fmt: skip
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    end = time.monotonic() + 120
    while not list(tmp_path.glob(".plan.tmp-*")) and time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.002)
    time.sleep(0.2)
    proc.send_signal(sig)  # mpiexec forwards it to every rank
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert lines and all(f"interrupted by {sig.name}" in ln for ln in lines), err
    assert list(tmp_path.iterdir()) == []


#: plan_ranks where rank 1 fails building its ``at``-th rank table; each ``at`` of the command
#: line in turn, on a communicator of its own (no message of one run can reach the next)
_FAILING_WRITE = """
import sys
from mpi4py import MPI
import varpack.make.mpi.write as W
from varpack.make.mpi import plan_ranks
from varpack.plan import PlanConfig
from varpack.sort.agree import Agreed
built = W.plan_tables
for at in sys.argv[3:]:
    comm = MPI.COMM_WORLD.Dup()
    def failing(*args, **kwargs):
        for i, table in enumerate(built(*args, **kwargs)):
            if comm.Get_rank() == 1 and i == int(at):
                raise OSError(28, "No space left on device")
            yield table
    W.plan_tables = failing
    try:
        plan_ranks(comm, sys.argv[1], f"{sys.argv[2]}-{at}", PlanConfig(max_tokens=4096, dp=4))
    except Agreed as exc:
        print(f"at {at}: rank {comm.Get_rank()}: {exc.error} ({exc.code})", flush=True)
"""
FAILING_AT = [0, 3]


@pytest.fixture(scope="module")
def failed_writes(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The failing writes of 3 ranks, one after the other in one job: its directory and
    stdout."""
    top = tmp_path_factory.mktemp("failing")
    rng = np.random.default_rng(2)
    write_shards(top / "meta", np.arange(3000), rng.integers(1, 3000, 3000), [3000])
    cli("sort", top / "meta", top / "sorted", "-q")
    script = top / "failing.py"
    script.write_text(_FAILING_WRITE)
    cmd = [str(BIN / "mpiexec"), "-n", "3", sys.executable, str(script), str(top / "sorted"),
           str(top / "out"), *map(str, FAILING_AT)]  # fmt: skip
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return top, got


@pytest.mark.parametrize("at", FAILING_AT)
def test_a_failure_while_writing_on_one_rank_is_agreed(
    failed_writes: tuple[Path, subprocess.CompletedProcess[str]], at: int
) -> None:
    """One rank fails building its part of a rank file (its disk fills): the owners still hear
    from it, nobody hangs, every rank gets that rank's error, and nothing is left."""
    top, got = failed_writes
    for r in range(3):  # every rank got rank 1's error (lines may interleave)
        assert f"at {at}: rank {r}: [Errno 28] No space left on device (1)" in got.stdout, got
    assert sorted(p.name for p in top.iterdir()) == ["failing.py", "meta", "sorted"]
