"""The summaries say what they count: ``plan``, ``validate`` and ``inspect`` name samples and
pieces, epochs and tokens the same way, show the LR factors' spread (and a note when a
``--base-batch-size`` far from a step's batch moves them all far from 1), and ``inspect`` names
shapes as rows × tokens and the shapes that really pad."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from testkit import cli, write_metadata

N = 600
SPLIT = 256


@pytest.fixture
def meta(tmp_path):
    rng = np.random.default_rng(3)
    lens = np.r_[rng.integers(8, 200, N - 20), rng.integers(300, 1000, 20)]  # 20 above the budget
    return write_metadata(tmp_path / "m.parquet", np.arange(N) * 7 + 1, lens), lens


def _summary(res) -> str:
    """The summary line of ``plan`` or ``validate`` (a mix's line comes first)."""
    (line,) = [x for x in res.stdout.splitlines() if " steps x " in x]
    return line


def test_plan_and_validate_name_samples_and_pieces_alike(meta, tmp_path):
    path, lens = meta
    pieces = int(np.ceil(lens / SPLIT).sum())  # a sample that fits is one piece
    out = tmp_path / "plan"
    made = _summary(cli("plan", path, out, "--max-tokens", SPLIT, "--oversize", "split"))
    ok = _summary(cli("validate", out, "--metadata", path))
    words = f"{N:,} samples ({pieces:,} pieces after splitting) -> "
    assert words in made and words in ok
    assert "planned samples" not in ok  # the old wording, pieces called samples
    text = cli("inspect", out).stdout
    assert re.search(rf"planned +{re.escape(words[:-4])}\n", text)
    assert re.search(r"pieces / step +\d", text)


def test_epochs_multiply_the_tokens_plainly(meta, tmp_path):
    path, lens = meta
    total = int(lens.sum())
    out = tmp_path / "plan"
    made = cli("plan", path, out, "--max-tokens", SPLIT, "--oversize", "split", "--epochs", 2)
    ok = _summary(cli("validate", out, "--metadata", path))
    words = f"{2 * total:,} tokens planned = 2 epochs x {total:,}"
    assert words in _summary(made) and words in ok
    assert f"{N:,} samples (" in ok and ") x 2 epochs -> " in ok
    assert f"real tokens     {words}" in cli("inspect", out).stdout


def test_dropped_samples_are_named_with_the_input_count(meta, tmp_path):
    path, _ = meta
    out = tmp_path / "plan"
    made = _summary(cli("plan", path, out, "--max-tokens", SPLIT, "--oversize", "drop"))
    ok = _summary(cli("validate", out, "--metadata", path))
    assert f"{N:,} samples (20 dropped) -> " in made and f"{N:,} samples (20 dropped) -> " in ok


def _step_factors(out) -> np.ndarray:
    t = pq.read_table(out / "rank-00000.parquet", columns=["step", "lr_factor"])
    step, lr = t.column("step").to_numpy(), t.column("lr_factor").to_numpy()
    return lr[np.unique(step, return_index=True)[1]]  # one factor a step


def test_lr_factors_range_median_and_the_base_batch_note(meta, tmp_path):
    path, _ = meta
    out = tmp_path / "plan"
    args = ("--max-tokens", SPLIT, "--oversize", "split", "--lr-scaling", "sqrt")
    made = cli("plan", path, out, *args, "--base-batch-size", 64)
    lr = _step_factors(out)
    assert np.median(lr) < 0.5  # steps of a few samples against a base of 64
    words = f"LR factor {lr.min():.3g} .. {lr.max():.3g}, median {np.median(lr):.3g} (sqrt)"
    assert words in _summary(made)
    note = [line for line in made.stderr.splitlines() if "LR factors" in line]
    assert len(note) == 1 and "mostly far below 1" in note[0]
    assert "--base-batch-size 64" in note[0] and f"median {np.median(lr):.3g}" in note[0]
    text = cli("inspect", out).stdout
    assert f"median {np.median(lr):.4g} (sqrt, --base-batch-size 64 samples)" in text
    assert "mostly far below 1" in text
    # a base near a step's batch: factors near 1, no note
    step_samples = pq.read_table(out / "rank-00000.parquet").column("step_samples").to_numpy()
    base = float(np.median(step_samples))
    near = cli("plan", path, tmp_path / "near", *args, "--base-batch-size", base)
    assert "LR factor" in _summary(near) and "LR factors" not in near.stderr


def test_inspect_shapes_read_rows_by_tokens_and_padding_that_is_true(meta, tmp_path):
    path, _ = meta
    packed = tmp_path / "packed"  # pad multiple 1: no shape pads anything
    cli("plan", path, packed, "--max-tokens", 1024, "--oversize", "split")
    text = cli("inspect", packed).stdout
    assert re.search(
        r"largest shapes +1×1,0\d\d: [\d,]+ micro-batch(es)?, [\d,]+ real tokens", text
    )
    assert "most padding    none: no shape pads" in text
    assert "costliest" not in text and "[1, " not in text
    padded = tmp_path / "padded"
    cli("plan", path, padded, "--max-tokens", 2048, "--layout", "padded", "--pad-multiple", 8)
    stats = json.loads((padded / "plan.json").read_text())["stats"]
    text = cli("inspect", padded).stdout
    top = max(stats["shapes"], key=lambda s: s["padding"])
    b, t = top["shape"]
    assert top["padding"] > 0
    assert re.search(rf"most padding +{b:,}×{t:,} {top['padding']:,} tokens \(", text)


def test_a_mix_says_how_many_samples_and_tokens_it_drew(tmp_path):
    rng = np.random.default_rng(5)
    lens = rng.integers(8, 200, 6000)
    source = np.array(["web", "code", "books"])[np.arange(6000) % 3]
    path = write_metadata(tmp_path / "m.parquet", np.arange(6000), lens, source=source)
    out = tmp_path / "plan"
    made = _summary(cli("plan", path, out, "--max-tokens", 16384, "--grad-accum", 4, "--source-column", "source",
                        "--mix", "web=0.5,code=0.25,books=0.25"))  # fmt: skip
    ok = _summary(cli("validate", out, "--metadata", path))
    mix = json.loads((out / "plan.json").read_text())["mix"]
    drawn = sum(f["planned_samples"] for f in mix["sources"].values())
    tokens = sum(f["planned_tokens"] for f in mix["sources"].values())
    assert drawn < 6000
    for line in (made, ok):
        assert f"{drawn:,} samples drawn by --mix from 6,000 -> " in line
        assert f"{tokens:,} tokens drawn by --mix from {int(lens.sum()):,}" in line
