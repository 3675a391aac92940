"""Every failure a user can cause or meet is one line (``varpack: error: ...``), never a
traceback, and leaves nothing behind: a full disk or read-only filesystem under ``sort``
(fault-injected), values that do not fit, figures that would overflow, bad environment
variables, a damaged CSV, errors inside DataLoader workers, and a trainer resumed wrongly."""

from __future__ import annotations

import errno
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli, write_metadata

from varpack.errors import ConfigError, InputError

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "jobs" / "train.py"


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip() and not ln.startswith("sort: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("varpack: error: "), stderr
    return lines[0]


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    return write_metadata(
        tmp_path / "meta" / "m.parquet", np.arange(500), rng.integers(1, 900, 500)
    )


# --- sort and the environment ----------------------------------------------------------------


@pytest.mark.parametrize("single_file", [False, True])
def test_sort_onto_a_full_disk(tmp_path: Path, meta: Path, monkeypatch, single_file: bool) -> None:  # type: ignore[no-untyped-def]
    import varpack.sort.output as output

    def full(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output, "bin_header" if single_file else "write_part", full)
    flags = ["--single-file"] if single_file else []
    result = cli("sort", meta.parent, tmp_path / "out" / "s", *flags, "-q", expect=1)
    line = _one_line(result.stderr)
    assert "No space left on device" in line and "free space" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta"]


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_sort_onto_a_read_only_filesystem(
    tmp_path: Path, meta: Path, monkeypatch, code: int
) -> None:  # type: ignore[no-untyped-def]
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if tmp_path / "ro" in (self, *self.parents):
            raise OSError(code, os.strerror(code), str(self))
        return real_mkdir(self, *args, **kwargs)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir)
    line = _one_line(cli("sort", meta.parent, tmp_path / "ro" / "s", "-q", expect=1).stderr)
    assert os.strerror(code) in line and "ro/s" in line
    assert list((tmp_path / "ro").iterdir()) == []


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "0"])
def test_a_bad_environment_variable_is_one_line(
    tmp_path: Path, meta: Path, monkeypatch, value: str
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("VARPACK_SORT_MAX_MESSAGE", value)
    line = _one_line(cli("sort", meta, tmp_path / "s", "--single-file", expect=2).stderr)
    assert f"VARPACK_SORT_MAX_MESSAGE='{value}'" in line
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VARPACK_PROGRESS_INTERVAL", "abc"),
        ("VARPACK_PROGRESS_INTERVAL", "-1"),
        ("VARPACK_PROGRESS_INTERVAL", "nan"),
        ("VARPACK_SORT_MAX_MESSAGE", "1e9"),
        ("VARPACK_THREADS", "0"),
        ("VARPACK_THREADS", "two"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "validate", "calibrate"])
def test_every_command_refuses_a_bad_varpack_variable(
    tmp_path: Path, meta: Path, monkeypatch, name: str, value: str, command: str
) -> None:  # type: ignore[no-untyped-def]
    # read before any work, whether or not the command uses it: never ignored, never a traceback
    args = {
        "plan": [meta, tmp_path / "p", "--max-tokens", 2048],
        "validate": [tmp_path / "p"],
        "calibrate": [tmp_path / "steps.csv", tmp_path / "c.json"],
    }[command]
    monkeypatch.setenv(name, value)
    line = _one_line(cli(command, *args, expect=2).stderr)
    assert f"environment variable {name}='{value}'" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta"]


def test_bad_rank_variables_in_the_reader(tmp_path: Path, meta: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from varpack.torch import PlanLoader

    cli("plan", meta, tmp_path / "plan", "--max-tokens", 2048, "-q")
    for name, value in (("RANK", "abc"), ("WORLD_SIZE", "0"), ("RANK", "-1")):
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError, match=f"environment variable {name}='{value}'"):
            PlanLoader(tmp_path / "plan", {})


# --- values and figures ---------------------------------------------------------------------


def test_carrying_a_value_beyond_int64(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    table = pa.table(
        {
            "sample_id": pa.array(np.arange(20)),
            "seq_len": pa.array(np.full(20, 10)),
            "src": pa.array([2**64 - 1] * 20, pa.uint64()),
        }
    )
    pq.write_table(table, path)
    line = _one_line(
        cli("plan", path, tmp_path / "p", "--max-tokens", 64, "--carry", "src", expect=2).stderr
    )
    assert "column 'src' cannot be carried as int64" in line
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--time-per-flop", "1e308"],
        ["--time-per-flop", "inf"],
        ["--time-per-flop", "nan"],
        ["--time-per-flop", "1e-12", "--time-fixed", "1e300"],
    ],
)
def test_a_cost_model_that_would_overflow_is_refused(tmp_path: Path, meta: Path, flags) -> None:  # type: ignore[no-untyped-def]
    args = ["--max-tokens", 2048, "--cost", "time", "--model-preset", "qwen2.5-0.5b", *flags]
    line = _one_line(cli("plan", meta, tmp_path / "p", *args, expect=2).stderr)
    assert "must be a finite number" in line
    assert not (tmp_path / "p").exists()


def test_every_plan_json_is_strict_json(tmp_path: Path, meta: Path) -> None:
    import json

    args = ["--cost", "time", "--model-preset", "qwen2.5-0.5b", "--time-per-flop", "1e20"]
    cli("plan", meta, tmp_path / "p", "--max-tokens", 2048, *args, "-q")  # the largest allowed
    text = (tmp_path / "p" / "plan.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"plan.json holds {c}"))
    cli("validate", tmp_path / "p")


def test_a_link_too_slow_to_price_is_refused(tmp_path: Path, meta: Path) -> None:
    args = ["--cp", 2, "--dp", 2, "--bucket-size", 4096, "--cost", "time", "--model-preset",
            "qwen2.5-0.5b", "--time-per-flop", "1e-12", "--comm-bytes-per-s", "1e-300"]  # fmt: skip
    result = cli("plan", meta, tmp_path / "p", *args, expect=2)
    assert "--comm-bytes-per-s 1e-300: must be at least 1" in _one_line(result.stderr)
    assert "Warning" not in result.stderr and not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--memory-per-token", "1e-300", "--memory-capacity", 2**62],
        ["--bucket-size", 2**31 - 1],
        ["--memory-per-token", "1e20", "--memory-capacity", 2**62, "--memory-fixed", "1e20"],
    ],
)
def test_cp_memory_options_at_their_limits(tmp_path: Path, meta: Path, flags) -> None:  # type: ignore[no-untyped-def]
    result = cli("plan", meta, tmp_path / "p", "--cp", 2, "--dp", 2, *flags, "-q", expect=None)
    assert "Traceback" not in result.stderr
    if result.exit_code:
        _one_line(result.stderr)
        assert not (tmp_path / "p").exists()
    else:
        cli("validate", tmp_path / "p")


def test_calibrate_on_a_csv_that_is_not_utf8(tmp_path: Path) -> None:
    csv = tmp_path / "steps.csv"
    csv.write_bytes("tokens,peak_memory\n1000,5\n2000,9\n".encode("utf-16"))
    line = _one_line(cli("calibrate", csv, tmp_path / "c.json", expect=2).stderr)
    assert "not UTF-8" in line and "steps.csv" in line
    assert not (tmp_path / "c.json").exists()


# --- the reader and the trainer ---------------------------------------------------------------


def _tokens(path: Path, lens: np.ndarray) -> Path:
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    values = pa.array(np.ones(int(lens.sum()), dtype=np.int32))
    table = pa.table(
        {
            "sample_id": pa.array(np.arange(len(lens))),
            "input_ids": pa.ListArray.from_arrays(pa.array(offsets), values),
        }
    )
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_a_dataloader_worker_is_the_error_itself(tmp_path: Path, workers: int) -> None:
    pytest.importorskip("torch")
    from varpack.torch import ParquetTokenDataset, PlanLoader

    lens = np.full(30, 20)
    write_metadata(tmp_path / "meta.parquet", np.arange(30), lens)
    cli("plan", tmp_path / "meta.parquet", tmp_path / "plan", "--max-tokens", 64, "-q")
    lens[7] += 3  # the data changed after planning
    data = ParquetTokenDataset(_tokens(tmp_path / "tok.parquet", lens))
    loader = PlanLoader(tmp_path / "plan", data, num_workers=workers)
    with pytest.raises(InputError) as info:
        for _ in loader:
            pass
    message = str(info.value)
    assert "\n" not in message and "Caught" not in message
    assert "sample id 7 has 23 tokens in the dataset, the plan says 20" in message


def _train(*args: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(ROOT / "jobs" / "train.py"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)


def _refused(trainer: Any, args: list[object], exit_code: int, why: str) -> None:
    """``trainer.main(args)`` in this process stops with a user error of one line: what
    ``run_job`` writes (the subprocess run below checks that writing once)."""
    with pytest.raises((ConfigError, InputError)) as info:
        trainer.main([str(a) for a in args])
    assert info.value.exit_code == exit_code and "\n" not in str(info.value)
    assert why in str(info.value), str(info.value)


@pytest.mark.slow
def test_the_trainer_refuses_a_wrong_resume_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    spec = importlib.util.spec_from_file_location("varpack_jobs_train_one_line", TRAIN)
    assert spec is not None and spec.loader is not None
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)  # one process's run: train.py's main, in this process
    lens = np.random.default_rng(1).integers(2, 30, 40)
    write_metadata(tmp_path / "meta.parquet", np.arange(40), lens)
    _tokens(tmp_path / "tok.parquet", lens)
    plan = ["plan", tmp_path / "meta.parquet", tmp_path / "plan", "--max-tokens", 64, "-q"]
    cli(*plan)
    base = [
        "--plan",
        tmp_path / "plan",
        "--data",
        tmp_path / "tok.parquet",
        "--out",
        tmp_path / "run",
    ]
    assert trainer.main([str(a) for a in [*base, "--max-steps", 2]]) == 0
    ckpt = tmp_path / "run" / "checkpoint.pt"
    good = ckpt.read_bytes()
    # a fresh run over a run's state is refused
    _refused(trainer, [*base, "--max-steps", 1], 2, "pass --resume to continue")
    assert ckpt.read_bytes() == good
    _refused(trainer, [*base, "--resume", "--preset", "small"], 2,  # another model
             "was saved with --preset tiny, this run has --preset small")  # fmt: skip

    # damage is refused by load_checkpoint (checksum, unreadable payload); through the trainer
    # once, as its own process, which says any of them in one line
    from varpack.torch.checkpoint import load_checkpoint

    flipped = good[:200] + bytes([good[200] ^ 1]) + good[201:]
    for damage, why in ((good[:-100], "checkpoint is corrupt"), (flipped, "checkpoint is corrupt"),
                        (b"not a checkpoint at all", "not a readable checkpoint")):  # fmt: skip
        ckpt.write_bytes(damage)
        with pytest.raises(InputError, match=why):
            load_checkpoint(ckpt)
    ckpt.write_bytes(flipped)
    bad = _train(*base, "--resume")
    assert bad.returncode == 2 and "checkpoint is corrupt" in _one_line(bad.stderr)

    ckpt.write_bytes(good)
    cli(*plan, "--grad-accum", 2, "--overwrite")  # a re-plan: another step count
    _refused(trainer, [*base, "--resume"], 2, "belongs to another plan")
