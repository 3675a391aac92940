"""``--overwrite`` replaces only what varpack wrote: an output holding anything the user put
there (notes, a checkpoint, a sub-directory, an empty directory, a link) is refused, naming it,
and left as it was; a single-file output (a calibration, a ``--single-file`` sort, a token copy, a
``--plot`` figure) is replaced only if varpack wrote it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli

from varpack.atomic import foreign_files, own_files


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    cli("synth", root / "meta", "--num-samples", 3000, "--max-len", 4000, "-q")
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 50, 40)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    tokens = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(rng.integers(1, 99, int(lens.sum())).astype(np.int32))
    )
    pq.write_table(pa.table({"input_ids": tokens}), root / "tok.parquet")
    return root


def _make(kind: str, inputs: Path, out: Path, *extra: object) -> None:
    args: dict[str, list[object]] = {
        "synth": ["synth", out, "--num-samples", 500],
        "sort": ["sort", inputs / "meta", out],
        "plan": ["plan", inputs / "meta", out, "--max-tokens", 4096, "--dp", 2],
        "lengths": ["lengths", inputs / "tok.parquet", out],
    }
    cli(*args[kind], "-q", *extra)


KINDS = ["synth", "sort", "plan", "lengths"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("added", ["notes.txt", "ckpt/checkpoint.pt", "checkpoint.pt"])
def test_a_file_the_user_added_is_never_deleted(
    tmp_path: Path, inputs: Path, kind: str, added: str
) -> None:
    out = tmp_path / "out"
    _make(kind, inputs, out)
    before = sorted(p.name for p in out.iterdir())
    assert foreign_files(out) == [] and own_files(out) is not None
    mine = out / added
    mine.parent.mkdir(exist_ok=True)
    mine.write_text("the user's")
    result = cli(*_args_again(kind, inputs, out), "--overwrite", expect=2)
    line = result.stderr.strip()
    assert line.count("\n") == 0 and f"holds files varpack did not write ({added})" in line
    assert mine.read_text() == "the user's"  # kept, and the output with it
    assert sorted(p.name for p in out.iterdir() if p.name != added.split("/")[0]) == before
    mine.unlink()
    if mine.parent != out:
        mine.parent.rmdir()
    _make(kind, inputs, out, "--overwrite")  # what is varpack's alone is replaced
    assert foreign_files(out) == []


def _args_again(kind: str, inputs: Path, out: Path) -> list[object]:
    return {
        "synth": ["synth", out, "--num-samples", 500, "-q"],
        "sort": ["sort", inputs / "meta", out, "-q"],
        "plan": ["plan", inputs / "meta", out, "--max-tokens", 4096, "--dp", 2, "-q"],
        "lengths": ["lengths", inputs / "tok.parquet", out, "-q"],
    }[kind]


def test_many_foreign_files_are_counted(tmp_path: Path, inputs: Path) -> None:
    out = tmp_path / "plan"
    _make("plan", inputs, out)
    for k in range(5):
        (out / f"n{k}.txt").write_text("x")
    line = cli(*_args_again("plan", inputs, out), "--overwrite", expect=2).stderr
    assert "(n0.txt, n1.txt, n2.txt and 2 more)" in line
    assert len(list(out.glob("n*.txt"))) == 5


def test_an_index_naming_a_file_outside_does_not_make_it_ours(tmp_path: Path, inputs: Path) -> None:
    # the index lists what may be replaced inside the output; the output is replaced as a whole,
    # so a file outside it is never touched whatever the index says
    out = tmp_path / "plan"
    _make("plan", inputs, out)
    outside = tmp_path / "keep.txt"
    outside.write_text("mine")
    (out / "extra.txt").write_text("x")
    cli(*_args_again("plan", inputs, out), "--overwrite", expect=2)
    assert outside.read_text() == "mine" and (out / "extra.txt").exists()


def test_a_marker_from_before_markers_listed_files_still_overwrites(
    tmp_path: Path, inputs: Path
) -> None:
    out = tmp_path / "synth"
    _make("synth", inputs, out)
    (out / "_varpack.json").write_text('{"format": "varpack.synth"}\n')  # an older marker
    assert own_files(out) is None
    _make("synth", inputs, out, "--overwrite")
    assert own_files(out) is not None


@pytest.mark.parametrize("kind", ["synth", "plan"])
def test_empty_directories_and_links_the_user_added_are_kept(
    tmp_path: Path, inputs: Path, kind: str
) -> None:
    out = tmp_path / "out"
    _make(kind, inputs, out)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "kept.txt").write_text("x")
    (out / "runs").mkdir()  # empty, for a trainer's checkpoints later
    (out / "data").symlink_to(target, target_is_directory=True)
    (out / "gone").symlink_to(tmp_path / "nothing")  # dangling
    assert foreign_files(out) == ["data", "gone", "runs/"]
    line = cli(*_args_again(kind, inputs, out), "--overwrite", expect=2).stderr.strip()
    assert "holds files varpack did not write (data, gone, runs/)" in line
    assert (out / "runs").is_dir() and (out / "data").is_symlink() and (out / "gone").is_symlink()
    assert (target / "kept.txt").exists()


def test_a_figure_is_replaced_only_if_varpack_drew_it(tmp_path: Path, inputs: Path) -> None:
    pytest.importorskip("matplotlib")
    plan = tmp_path / "plan"
    _make("plan", inputs, plan)
    for suffix in ("png", "svg", "pdf"):
        figure = tmp_path / f"fig.{suffix}"
        cli("inspect", plan, "--plot", figure)
        cli("inspect", plan, "--plot", figure, "--overwrite")  # varpack's own: replaced
        figure.write_bytes(b"the user's figure")
        line = cli("inspect", plan, "--plot", figure, "--overwrite", expect=2).stderr.strip()
        assert "not an output varpack wrote" in line and "\n" not in line
        assert figure.read_bytes() == b"the user's figure"


@pytest.mark.parametrize("kind", ["calibrate", "sort --single-file", "lengths --arrow-copy"])
def test_a_single_file_output_is_replaced_only_if_varpack_wrote_it(
    tmp_path: Path, inputs: Path, kind: str
) -> None:
    target = tmp_path / "out.bin"
    csv = tmp_path / "steps.csv"
    csv.write_text("tokens,peak_memory\n1000,5000\n2000,9000\n")
    args: list[object] = {
        "calibrate": ["calibrate", csv, target],
        "sort --single-file": ["sort", inputs / "meta", target, "--single-file", "-q"],
        "lengths --arrow-copy": [
            "lengths",
            inputs / "tok.parquet",
            tmp_path / "meta",
            "--arrow-copy",
            target,
            "-q",
        ],
    }[kind]
    cli(*args)
    if kind.startswith("lengths"):
        (tmp_path / "meta" / "notes.txt").write_text("mine")  # the metadata beside it is kept
        line = cli(*args, "--overwrite", expect=2).stderr.strip()
        assert "(notes.txt)" in line and (tmp_path / "meta" / "notes.txt").exists()
        (tmp_path / "meta" / "notes.txt").unlink()
    cli(*args, "--overwrite")  # varpack's own: replaced
    target.write_bytes(b"the user's file")
    line = cli(*args, "--overwrite", expect=2).stderr.strip()
    assert "not an output varpack wrote" in line and "\n" not in line
    assert target.read_bytes() == b"the user's file"
