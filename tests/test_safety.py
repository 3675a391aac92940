"""Safety as a careless or unlucky user meets it: inputs never touched, bounds checked up front,
one line for every failure, nothing left behind by an interruption.

Each test is one case of misuse; the sort's own cases (MPI ranks, signals under mpiexec) live in
``tests/sort/``, validate's strictness in ``tests/validate/``.
"""

from __future__ import annotations

import errno
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from testkit import cli, write_metadata, write_shards

import varpack.make as make
from varpack.metadata.contract import read_metadata

BASE = ["--max-tokens", "4096", "--dp", "2"]


@pytest.fixture
def meta(tmp_path: Path, rng: np.random.Generator) -> Path:
    n = 1300
    return write_shards(tmp_path / "meta", rng.permutation(n), rng.integers(1, 900, n), [500, 800])


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _one_line(result) -> str:  # type: ignore[no-untyped-def]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("varpack: error: ")
    return lines[0]


# --- outputs never touch inputs ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["parent", "itself", "inside"])
def test_plan_output_never_overlaps_its_input(tmp_path: Path, meta: Path, where: str) -> None:
    before = _files(tmp_path)
    out = {"parent": tmp_path, "itself": meta, "inside": meta / "plan"}[where]
    result = cli("plan", meta, out, *BASE, "--overwrite", expect=2)
    assert "input" in _one_line(result)
    assert _files(tmp_path) == before  # nothing deleted, nothing written


def test_plan_output_through_a_symlink_to_the_input(tmp_path: Path, meta: Path) -> None:
    (tmp_path / "alias").symlink_to(meta)
    result = cli("plan", meta, tmp_path / "alias", *BASE, "--overwrite", expect=2)
    assert "is the input" in _one_line(result)
    assert read_metadata(meta).num_rows == 1300


def test_synth_over_a_directory_it_did_not_write(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    result = cli("synth", ".", "-n", "100", "--overwrite", expect=2)
    assert "not an output varpack wrote" in _one_line(result)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_overwrite_replaces_a_previous_plan(tmp_path: Path, meta: Path) -> None:
    cli("plan", meta, tmp_path / "plan", *BASE, "-q")
    cli("plan", meta, tmp_path / "plan", *BASE, "--dp", "1", "--overwrite", "-q")
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == [
        "plan.json",
        "rank-00000.parquet",
    ]


# --- inputs read completely or refused -----------------------------------------------------------


def test_symlinked_directory_is_followed(tmp_path: Path, rng: np.random.Generator) -> None:
    write_metadata(tmp_path / "in" / "own.parquet", np.arange(500), rng.integers(1, 50, 500))
    write_metadata(tmp_path / "far" / "x.parquet", np.arange(500, 1300), rng.integers(1, 50, 800))
    (tmp_path / "in" / "linked").symlink_to(tmp_path / "far")
    (tmp_path / "far" / "loop").symlink_to(tmp_path / "in")  # a loop ends, read once
    assert read_metadata(tmp_path / "in").num_rows == 1300
    out = cli("check", tmp_path / "in", "--json").stdout
    assert '"count": 1300' in out and str(tmp_path / "in" / "linked") in out
    text = cli("check", tmp_path / "in").stdout
    assert f"followed 2 symbolic link(s): {tmp_path / 'in' / 'linked'}" in text


def test_dangling_symlink_is_refused_by_name(tmp_path: Path, meta: Path) -> None:
    (meta / "gone.parquet").symlink_to(tmp_path / "nowhere.parquet")
    result = cli("check", meta, expect=2)
    assert "gone.parquet: a symbolic link to nothing" in _one_line(result)


# --- bounds, checked before any work -------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, value",
    [("--pack-to", "3000000000"), ("--pad-multiple", "3000000000"), ("--max-tokens", "1e20"),
     ("--epochs", "1000000000"), ("--dp", "0"), ("--seed", "-1")],
)  # fmt: skip
def test_out_of_range_option_is_one_usage_line(tmp_path: Path, meta: Path, flag, value) -> None:  # type: ignore[no-untyped-def]
    args = ["--max-tokens", "4096"] if flag != "--max-tokens" else []
    result = cli("plan", meta, tmp_path / "a" / "plan", *args, flag, value, expect=2)
    line = _one_line(result)
    assert flag in line and "see varpack plan --help" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta"]  # no parent directory made


def test_ranges_are_stated_in_help() -> None:
    text = cli("plan", "--help").stdout
    assert "1<=x<=2147483647" in text and "1<=x<=1048576" in text


def test_a_plan_too_big_for_memory_is_refused_up_front(
    tmp_path: Path, meta: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(make, "available_memory", lambda: 100 * 2**20)
    result = cli("plan", meta, tmp_path / "plan", *BASE, "--epochs", "5000", expect=2)
    line = _one_line(result)
    assert "6,500,000 planned rows" in line and "GiB" in line and "--epochs" in line
    assert not (tmp_path / "plan").exists()


def test_lengths_beyond_int32_are_refused(tmp_path: Path) -> None:
    write_metadata(tmp_path / "m.parquet", [1, 2, 3], [5, 2**62, 2**62])
    for cmd in (["check"], ["plan", "--max-tokens", "8"]):
        extra = [tmp_path / "p"] if cmd[0] == "plan" else []
        result = cli(cmd[0], tmp_path / "m.parquet", *extra, *cmd[1:], expect=2)
        assert "seq_len over 2,147,483,647" in _one_line(result)


def test_config_file_not_utf8(tmp_path: Path, meta: Path) -> None:
    (tmp_path / "plan.toml").write_bytes(b"max_tokens = 4096\n# caf\xe9\n")
    result = cli("plan", meta, tmp_path / "p", "--config", tmp_path / "plan.toml", expect=2)
    assert "not UTF-8" in _one_line(result)


def test_config_key_given_twice(tmp_path: Path, meta: Path) -> None:
    (tmp_path / "plan.toml").write_text("max-tokens = 4096\nmax_tokens = 64\n")
    result = cli("plan", meta, tmp_path / "p", "--config", tmp_path / "plan.toml", expect=2)
    assert "given twice" in _one_line(result)


# --- one line for every failure ------------------------------------------------------------------


def test_unknown_flag_is_one_line(tmp_path: Path) -> None:
    result = cli("plan", "--max-tokenz", "3", "a", "b", expect=2)
    assert "No such option" in _one_line(result)


def test_newline_in_a_path_stays_one_line(tmp_path: Path) -> None:
    result = cli("check", tmp_path / "bad\nname", expect=2)
    _one_line(result)


def test_output_directory_without_permission(tmp_path: Path, meta: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real_mkdir = Path.mkdir  # injected: root may write into a chmod 500 directory

    def mkdir(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if tmp_path / "ro" in (self, *self.parents):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir)
    result = cli("plan", meta, tmp_path / "ro" / "plan", *BASE, expect=1)
    assert "permission denied" in _one_line(result)
    assert list((tmp_path / "ro").iterdir()) == []


def test_read_only_filesystem(tmp_path: Path, meta: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if tmp_path / "ro" in (self, *self.parents):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir)
    result = cli("plan", meta, tmp_path / "ro" / "plan", *BASE, expect=1)
    line = _one_line(result)
    assert "Read-only file system" in line and "write elsewhere" in line


def test_disk_full_while_writing(tmp_path: Path, meta: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import varpack.planfile.format as fmt

    def full(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fmt.pq, "write_table", full)
    result = cli("plan", meta, tmp_path / "out" / "plan", *BASE, expect=1)
    line = _one_line(result)
    assert "No space left on device" in line and "plan" in line and "free space" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta"]


def test_file_size_limit_while_writing(tmp_path: Path, meta: Path) -> None:
    import resource

    def limit() -> None:  # 2 KiB per file: the rank files are larger
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 11, 1 << 11))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process

    def plan(out: Path) -> list[str]:
        return [sys.executable, "-m", "varpack", "plan", str(meta), str(out), *BASE, "--dp", "1",
                "--pad-multiple", "1"]  # fmt: skip

    # The same plan once without the limit first: numba writes its kernel caches (larger than
    # 2 KiB) on a fresh checkout, and this test is about the plan's own files.
    warm = tmp_path.parent / f"{tmp_path.name}-warm"
    subprocess.run(plan(warm / "plan"), check=True, capture_output=True, timeout=300)
    shutil.rmtree(warm, ignore_errors=True)
    proc = subprocess.run(
        plan(tmp_path / "plan"), capture_output=True, text=True, preexec_fn=limit, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "size this system allows" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta"]


# --- interruption --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_meta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("big") / "meta"
    cli("synth", root, "-n", "3M", "--shards", "4", "-q")
    return root


@pytest.fixture(scope="module")
def small_meta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small") / "meta"
    cli("synth", root, "-n", "2000", "-q")
    return root


def _start_plan(meta: Path, out: Path) -> subprocess.Popen[str]:
    args = [str(meta), str(out), "--max-tokens", "65536", "--oversize", "drop", "--dp", "64",
            "--order", "shuffle", "-q"]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "varpack", "plan", *args],
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_temp(out: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Poll until the plan's temporary directory exists: the run is writing."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if list(out.parent.glob(f".{out.name}.tmp-*[!k]")) or proc.poll() is not None:
            return
        time.sleep(0.005)
    raise AssertionError("the plan never started writing")


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_plan_leaves_nothing(tmp_path: Path, big_meta: Path, sig, code) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "plan"
    proc = _start_plan(big_meta, out)
    _wait_for_temp(out, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [
        f"varpack: error: interrupted by {signal.Signals(sig).name}; the partial output was removed"
    ]
    # nothing at all is left: the next run starts as any first plan does (a rerun over what a
    # run leaves is the killed plan's test below)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_killed_plan_leaves_a_temporary_the_next_run_removes(
    tmp_path: Path, big_meta: Path, small_meta: Path
) -> None:
    out = tmp_path / "plan"
    proc = _start_plan(big_meta, out)
    _wait_for_temp(out, proc)
    proc.kill()
    proc.communicate(timeout=60)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left and all(name.startswith(".plan.tmp-") for name in left)  # SIGKILL: no cleanup
    # the next run removes it when it checks the output, before it reads any input: a small one
    cli("plan", small_meta, out, "--max-tokens", "65536", "--oversize", "drop", "--dp", "2", "-q")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]


def test_a_file_written_during_removal_does_not_keep_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that creates a file while the tree is removed: one pass leaves the directory
    (its rmdir fails); the next pass removes it."""
    import shutil

    from varpack.atomic import remove

    tmp = tmp_path / ".plan.tmp-abc"
    tmp.mkdir()
    (tmp / "rank-00000.parquet").write_bytes(b"x")
    real = shutil.rmtree
    passes = []

    def racing(path, ignore_errors=False):  # type: ignore[no-untyped-def]
        passes.append(path)
        real(path, ignore_errors=ignore_errors)
        if len(passes) == 1:  # the late writer: the directory and a new file are back
            Path(path).mkdir()
            (Path(path) / "rank-00001.parquet").write_bytes(b"y")

    monkeypatch.setattr(shutil, "rmtree", racing)
    remove(tmp)
    assert not tmp.exists() and len(passes) == 2


def test_a_signal_swallowed_by_a_c_callback_is_raised_at_the_next_agreement(capfd) -> None:  # type: ignore[no-untyped-def]
    """numba compiles through llvmlite's ctypes callbacks: a SIGTERM that arrives there raises
    inside the callback, where ctypes swallows it. The next agreement raises it again, and the
    swallowed one prints no traceback."""
    import ctypes
    import os

    from varpack.atomic import interruptible
    from varpack.errors import Interrupted
    from varpack.sort.agree import agree

    class One:  # agree's collectives on a communicator of one rank
        def Get_rank(self) -> int:
            return 0

        def allgather(self, value):  # type: ignore[no-untyped-def]
            return [value]

    callback = ctypes.CFUNCTYPE(None)(lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(Interrupted, match="SIGTERM"), interruptible():
        callback()  # the handler's exception is swallowed here
        time.sleep(0.05)
        agree(One(), lambda: None)
    assert "Traceback" not in capfd.readouterr().err
    assert agree(One(), lambda: 7) == 7  # outside the block: nothing pending
