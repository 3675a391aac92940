"""``varpack sort`` as a careless or unlucky user meets it, on one rank and under ``mpiexec``.

Outputs never touch inputs, ids are checked without an in-band sentinel, an unwritable output is
one line, and a signal (SIGTERM, SIGINT, SIGKILL) at 1 or 2 ranks, landing while the output is
being written, leaves nothing in the output's parent directory or in ``/dev/shm`` once the rerun
is done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from testkit import BIN, cli, mpiexec, write_metadata, write_shards

SHM = Path("/dev/shm")


@pytest.fixture
def meta(tmp_path: Path, rng: np.random.Generator) -> Path:
    n = 1300
    return write_shards(tmp_path / "meta", rng.permutation(n), rng.integers(1, 900, n), [500, 800])


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("sort: ")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("varpack: error: ")
    return lines[0]


# --- outputs never touch inputs ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["parent", "itself", "inside"])
def test_sort_output_never_overlaps_its_input(tmp_path: Path, meta: Path, where: str) -> None:
    out = {"parent": tmp_path, "itself": meta, "inside": meta / "sorted"}[where]
    before = sorted(meta.iterdir())
    result = cli("sort", meta, out, "--overwrite", expect=2)
    line = _one_line(result.stderr)
    assert {"parent": "contains the input", "itself": "is the input", "inside": "lies inside"}[
        where
    ] in line
    assert sorted(meta.iterdir()) == before


def test_sort_overwrite_only_replaces_a_sort_output(tmp_path: Path, meta: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    line = _one_line(cli("sort", meta, mine, "--overwrite", expect=2).stderr)
    assert "not an output varpack wrote" in line and (mine / "notes.txt").exists()
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"not a sort output")
    cli("sort", meta, plain, "--single-file", "--overwrite", expect=2)
    assert plain.read_bytes() == b"not a sort output"
    for args in (["--single-file"], []):  # an earlier sort output, in either form, is replaced
        out = tmp_path / ("sorted.bin" if args else "sorted")
        cli("sort", meta, out, *args, "-q")
        cli("sort", meta, out, *args, "-q", "--overwrite")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "meta",
        "mine",
        "plain.bin",
        "sorted",
        "sorted.bin",
    ]


@pytest.mark.parametrize("ranks", [1, 2])
def test_duplicate_of_the_largest_id_is_found(tmp_path: Path, ranks: int) -> None:
    top = int(np.iinfo(np.int64).max)
    write_metadata(tmp_path / "in" / "a.parquet", [1, 2, top], [5, 5, 5])
    write_metadata(tmp_path / "in" / "b.parquet", [4, top, 6], [5, 5, 5])
    if ranks == 1:
        stderr = cli("sort", tmp_path / "in", tmp_path / "out", expect=2).stderr
    else:
        proc = mpiexec(2, "sort", tmp_path / "in", tmp_path / "out", check=False)
        assert proc.returncode == 2, proc.stderr
        stderr = proc.stderr
    assert f"duplicate sample_id {top}" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("single_file", [False, True])
def test_unwritable_output_is_one_line_on_every_rank(meta: Path, single_file: bool) -> None:
    out = Path("/sys/varpack-sorted")  # nobody, root included, may create files here
    args = ["--single-file"] if single_file else []
    proc = mpiexec(2, "sort", meta, out, *args, check=False)
    assert proc.returncode == 1, proc.stderr
    line = _one_line(proc.stderr)
    assert str(out) in line and "Traceback" not in proc.stderr


# --- interruption --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_meta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("big") / "meta"
    cli("synth", root, "-n", "12M", "--shards", "4", "-q")
    return root


def _mapped() -> set[str]:
    """Shared-memory files some live process maps (a concurrent MPI job's, not a leftover)."""
    names: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            names.update(
                ln.split()[-1] for ln in maps.read_text().splitlines() if "/dev/shm/" in ln
            )
        except (OSError, IndexError):
            continue
    return names


@pytest.fixture
def shm_unchanged() -> Iterator[None]:
    """After the test, no MPI shared-memory segment is left that was not there before."""
    before = set(SHM.glob("mpich_shm_*")) if SHM.is_dir() else set()
    yield
    new = {str(p) for p in set(SHM.glob("mpich_shm_*")) - before if p.exists()}
    left = new - _mapped()
    assert not left, f"left in /dev/shm: {sorted(left)}"


def _interrupted_lines(stderr: str, name: str) -> None:
    """Each rank the signal reached may say so (rank 0 first, usually alone): nothing else."""
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("sort: ")]
    assert lines, stderr
    for line in lines:
        assert line.startswith(f"varpack: error: interrupted by {name}"), stderr
        assert line.endswith("the partial output was removed"), stderr


def _gone(out: Path, timeout: float = 30) -> bool:
    end = time.monotonic() + timeout
    while _ranks_of(out) and time.monotonic() < end:
        time.sleep(0.05)
    return not _ranks_of(out)


def _start(meta: Path, out: Path, ranks: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "varpack", "sort", str(meta), str(out), "-q"]
    if ranks > 1:
        mpi = [str(BIN / "mpiexec"), "-n", str(ranks), sys.executable, "-m", "mpi4py"]
        cmd = [*mpi, *cmd[1:]]
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_writing(out: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Poll until a part file appears in the sort's temporary directory: it is writing."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if list(out.parent.glob(f".{out.name}.tmp-*/part-*")):
            return
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.002)
    raise AssertionError("the sort never started writing")


def _ranks_of(out: Path) -> list[int]:
    """pids of the rank processes (not the launcher) sorting into ``out``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in argv and not argv[0].endswith(b"mpiexec"):
            if b"varpack" in argv and argv[0] == sys.executable.encode():
                pids.append(int(cmdline.parent.name))
    return sorted(pids)


@pytest.fixture(scope="module")
def small_meta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small") / "meta"
    cli("synth", root, "-n", "2000", "--shards", "2", "-q")
    return root


def _rerun_leaves_only_the_output(meta: Path, out: Path, ranks: int) -> None:
    """The next sort removes the killed one's temporary when it checks the output, before it
    reads any input (so a small input serves)."""
    if ranks == 1:
        cli("sort", meta, out, "-q")
    else:
        mpiexec(ranks, "sort", meta, out, "-q")
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]


@pytest.mark.slow
@pytest.mark.usefixtures("shm_unchanged")
@pytest.mark.parametrize(
    "ranks, sig, code",
    [(1, signal.SIGTERM, 143), (2, signal.SIGTERM, 143), (2, signal.SIGINT, 130)],
)
def test_signal_during_sort_leaves_nothing(
    tmp_path: Path, big_meta: Path, ranks: int, sig: signal.Signals, code: int
) -> None:
    out = tmp_path / "sorted"
    proc = _start(big_meta, out, ranks)
    _wait_for_writing(out, proc)
    proc.send_signal(sig)  # to the launcher under mpiexec: it forwards the signal to every rank
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    _interrupted_lines(err, signal.Signals(sig).name)
    # nothing at all is left, so the next run starts as any first sort does (a rerun over what
    # a run leaves is the killed sort's test below)
    assert _gone(out) and list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.usefixtures("shm_unchanged")
def test_signal_to_one_rank_ends_every_rank(tmp_path: Path, big_meta: Path) -> None:
    out = tmp_path / "sorted"
    proc = _start(big_meta, out, 2)
    _wait_for_writing(out, proc)
    os.kill(_ranks_of(out)[-1], signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    _interrupted_lines(err, "SIGTERM")
    assert _gone(out) and list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.usefixtures("shm_unchanged")
@pytest.mark.parametrize("ranks", [1, 2])
def test_killed_sort_leaves_a_temporary_the_next_run_removes(
    tmp_path: Path, big_meta: Path, small_meta: Path, ranks: int
) -> None:
    out = tmp_path / "sorted"
    proc = _start(big_meta, out, ranks)
    _wait_for_writing(out, proc)
    for pid in _ranks_of(out):
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert _gone(out)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left and all(name.startswith(".sorted.tmp-") for name in left)  # no cleanup possible
    _rerun_leaves_only_the_output(small_meta, out, ranks)


def test_failed_sort_leaves_no_parent_directories(tmp_path: Path) -> None:
    write_metadata(tmp_path / "in" / "a.parquet", [1, 2, 2], [5, 5, 5])  # a duplicate id
    cli("sort", tmp_path / "in", tmp_path / "new" / "deep" / "sorted", expect=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_oversample_range_is_a_usage_line_naming_the_command(meta: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "varpack", "sort", str(meta), str(tmp_path / "s"), "--oversample", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    line = _one_line(proc.stderr)
    assert "1<=x<=1048576" in line and line.endswith("see varpack sort --help")
    assert not (tmp_path / "s").exists()
