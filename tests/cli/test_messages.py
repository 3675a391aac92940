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
    (line,) = [x for x in res.stdout.splitlines() if re.search(r" steps? x ", x)]
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
    assert f"real tokens     {2 * total:,} (2 epochs x {total:,})\n" in cli("inspect", out).stdout


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


#: a few option sets whose summaries must say each figure once, named as everywhere else
OPTION_SETS = {
    "split": ["--oversize", "split"],
    "drop": ["--oversize", "drop"],
    "alone": ["--oversize", "alone"],
    "where": ["--oversize", "drop", "--where", "src <> 'web'"],
    "carry": ["--oversize", "split", "--carry", "src", "--dp", 2],
    "epochs": ["--oversize", "alone", "--epochs", 3, "--grad-accum", 2],
    "mix": ["--oversize", "drop", "--source-column", "src", "--mix", "web=0.5,code=0.5"],
}
#: a count of one with a plural noun, the old "1 ranks"
ONE_PLURAL = re.compile(
    r"(?<![\d,.])1 (ranks|micro-batches|steps|documents|samples|pieces|tokens)\b"
)


@pytest.fixture
def sourced(tmp_path):
    rng = np.random.default_rng(8)
    lens = np.r_[rng.integers(8, 200, N - 20), rng.integers(300, 1000, 20)]
    src = np.array(["web", "code"])[np.arange(N) % 2]
    return write_metadata(tmp_path / "m.parquet", np.arange(N) * 7 + 1, lens, src=src), lens


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_plan_validate_and_inspect_tell_the_same_figures(sourced, tmp_path, name):
    path, _ = sourced
    out = tmp_path / "plan"
    made = cli("plan", path, out, "--max-tokens", SPLIT, *OPTION_SETS[name])
    ok = _summary(cli("validate", out, "--metadata", path))
    line = _summary(made)
    # the same samples, layout, tokens planned, fill and padding; then the same token figures
    assert ok.removeprefix("OK ").split(", time ")[0] == line.split(", time ")[0]
    assert ok.split("; tokens kept ")[1].split("; carried")[0] == line.split("; tokens kept ")[1]
    text = cli("inspect", out).stdout
    for said in (made.stdout, ok, text):
        assert not ONE_PLURAL.search(said), said
    assert line.count("kept") == 1  # the planner's tokens kept, once
    where = [x for x in made.stdout.splitlines() if x.startswith("where ")]
    assert [("selected" in x and "kept" not in x) for x in where] == ([True] if where else [])
    doc = json.loads((out / "plan.json").read_text())
    t = doc["stats"]["tokens"]
    assert f"tokens kept {t['kept']:,} of {t['total']:,} (" in line
    assert re.search(rf"tokens +kept {t['kept']:,} of {t['total']:,} \(", text)


def test_a_plan_of_one_of_each_says_one(tmp_path):
    path = write_metadata(tmp_path / "m.parquet", [5], [700])  # one document, three pieces
    out = tmp_path / "plan"
    made = _summary(cli("plan", path, out, "--max-tokens", SPLIT, "--oversize", "split",
                        "--grad-accum", 3))  # fmt: skip
    assert "1 sample (3 pieces after splitting) -> 1 step x 1 rank x 3 micro-batches; " in made
    assert "700 tokens planned" in made and "(100.00%: 1 document in 3 pieces)" in made
    one = tmp_path / "one"
    cli("plan", write_metadata(tmp_path / "o.parquet", [5], [7]), one, "--max-tokens", SPLIT)
    for said in (_summary(cli("validate", one)), cli("inspect", one).stdout):
        assert not ONE_PLURAL.search(said), said
        assert "1 step" in said and "1 sample" in said


def test_a_selection_is_selected_and_the_token_figures_count_of_it(sourced, tmp_path):
    path, lens = sourced
    out = tmp_path / "plan"
    made = cli("plan", path, out, "--max-tokens", SPLIT, "--oversize", "drop", "--where",
               "src = 'code'")  # fmt: skip
    code = (np.arange(N) % 2) == 1
    picked, over = int(lens[code].sum()), int(lens[code & (lens > SPLIT)].sum())
    where = made.stdout.splitlines()[0]
    assert where.startswith(f"where src = 'code': selected {code.sum():,} of {N:,} samples")
    assert f", {picked:,} of {int(lens.sum()):,} tokens (" in where
    assert f"tokens kept {picked - over:,} of {picked:,} (" in _summary(made)
    text = cli("inspect", out).stdout
    assert re.search(rf"input +{N:,} samples, {int(lens.sum()):,} tokens", text)  # the input's
    assert re.search(rf"selection +where src = 'code': selected {code.sum():,} of {N:,}", text)
    assert re.search(rf"planned +{code.sum():,} samples \(\d+ dropped\)", text)


@pytest.mark.parametrize(
    ("mode", "rows", "absent"),
    [
        ("drop", [r"dropped +20 samples \(--oversize drop\)"], ["alone"]),
        ("alone", [r"alone +20 samples longer than the budget, each in a micro-batch of its own"],
         ["dropped  ", "--oversize drop"]),
        ("split", [], ["dropped  ", "alone", "--oversize"]),
    ],
)  # fmt: skip
def test_inspect_names_only_the_oversize_mode_used(meta, tmp_path, mode, rows, absent):
    out = tmp_path / "plan"
    cli("plan", meta[0], out, "--max-tokens", SPLIT, "--oversize", mode, "-q")
    text = cli("inspect", out).stdout
    for row in rows:
        assert re.search(row, text), text
    for word in absent:
        assert word not in text.replace("pieces / step", ""), (word, text)
