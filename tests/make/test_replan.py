"""``varpack replan``: a plan continued from a step on another layout, checked against its parent.

Invariants, on random plans and random steps: the child holds exactly what the parent's steps
from S hold (validate, with the parent: every sample once per epoch), equal micro-batch counts
and the budget; the same dp is the identity; keeping dp x grad-accum keeps every step's samples;
planning what is left again keeps shuffled samples near where they were."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from testkit import cli, write_metadata

from varpack.errors import ConfigError
from varpack.make.replan import replan
from varpack.metadata.synth import sample_lengths
from varpack.planfile.format import VERSION, load_plan
from varpack.validate import validate_plan

BASE = ("--max-tokens", 2048, "--cost", "flops", "--model-preset", "qwen2.5-0.5b", "-q")


def _meta(tmp: Path, n: int, seed: int, shape: str = "uniform") -> Path:
    rng = np.random.default_rng(seed)
    lens = (
        rng.integers(16, 1500, n)
        if shape == "uniform"
        else np.minimum(sample_lengths(shape, n, rng), 2048)
    )
    ids = rng.permutation(10 * n)[:n]
    return write_metadata(tmp / "meta" / "m.parquet", ids, lens).parent


def _plan(tmp: Path, name: str, *opts: object, n: int = 3000, seed: int = 0) -> Path:
    meta = tmp / "meta" if (tmp / "meta").exists() else _meta(tmp, n, seed)
    cli("plan", meta, tmp / name, *BASE, *opts)
    return tmp / name


def _rows(plan: Path, step: int = 0) -> list[dict]:
    p = load_plan(plan)
    out = []
    for r in range(p.dp):
        t = p.rank_table(r)
        out.append(t.filter(pc.greater_equal(t.column("step"), step)).to_pydict())
    return out


def _step_sets(plan: Path) -> dict[int, list[int]]:
    sets: dict[int, list[int]] = {}
    for rows in _rows(plan):
        for s, ids in zip(rows["step"], rows["sample_ids"], strict=True):
            sets.setdefault(s, []).extend(ids)
    return {s: sorted(v) for s, v in sets.items()}


def test_the_same_dp_is_the_identity(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "plan", "--dp", 2, "--grad-accum", 2, "--order", "shuffle")
    replan(plan, tmp_path / "child", 17)
    assert _rows(tmp_path / "child") == _rows(plan, 17)  # every column of every row
    assert json.loads((tmp_path / "child" / "plan.json").read_text())["version"] == VERSION


@pytest.mark.parametrize("dp", [1, 3, 6])
def test_keeping_dp_x_grad_accum_keeps_every_steps_samples(tmp_path: Path, dp: int) -> None:
    plan = _plan(tmp_path, "plan", "--dp", 2, "--grad-accum", 3, "--order", "shuffle",
                 "--lr-scaling", "linear", "--base-batch-size", 64)  # fmt: skip
    meta, kept = replan(plan, tmp_path / "child", 5, {"dp": dp})
    assert kept and meta["layout"]["grad_accum"] == 6 // dp
    parent, child = _step_sets(plan), _step_sets(tmp_path / "child")
    assert child == {s: v for s, v in parent.items() if s >= 5}
    lr = {
        s: f
        for rows in _rows(plan, 5)
        for s, f in zip(rows["step"], rows["lr_factor"], strict=True)
    }
    for rows in _rows(tmp_path / "child"):  # the same LR factor on every step
        assert all(lr[s] == f for s, f in zip(rows["step"], rows["lr_factor"], strict=True))
    assert not validate_plan(tmp_path / "child").problems


@pytest.mark.parametrize("case", range(10))
def test_random_replans_hold_every_invariant_with_their_parent(tmp_path: Path, case: int) -> None:
    rng = np.random.default_rng(case)
    dp, k = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    order = ["shuffle", "curriculum"][case % 2]
    epochs = int(rng.integers(1, 3))
    shape = ["uniform", "long-tail", "bimodal"][case % 3] if case % 4 != 3 else "uniform"
    _meta(tmp_path, int(rng.integers(800, 3000)), case, shape)
    extra = ("--layout", "padded") if case % 4 == 3 else ()
    plan = _plan(tmp_path, "plan", "--dp", dp, "--grad-accum", k, "--order", order,
                 "--epochs", epochs, "--oversize", "drop", "--seed", case, *extra)  # fmt: skip
    steps = load_plan(plan).num_steps
    at = int(rng.integers(0, steps))
    options: dict[str, object] = {"dp": int(rng.integers(1, 6))}
    if case % 3 == 0:
        options["grad_accum"] = int(rng.integers(1, 4))
    if case % 5 == 0:
        options["max_tokens"] = 4096
    meta, _ = replan(plan, tmp_path / "child", at, options)
    report = validate_plan(tmp_path / "child", load_ids(tmp_path))
    assert not report.problems, report.problems
    # a child of the child: the run's coverage over three plans
    at2 = at + int(rng.integers(0, meta["num_steps"]))
    replan(tmp_path / "child", tmp_path / "grandchild", at2, {"dp": dp})
    assert not validate_plan(tmp_path / "grandchild", load_ids(tmp_path)).problems


def load_ids(tmp: Path) -> tuple[np.ndarray, np.ndarray]:
    from varpack.make import read_input

    return read_input(tmp / "meta")


def test_planning_what_is_left_keeps_shuffled_samples_near_where_they_were(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "plan", "--dp", 4, "--grad-accum", 2, "--order", "shuffle",
                 "--shuffle-window", 4, n=20000)  # fmt: skip
    at = 30
    meta, kept = replan(plan, tmp_path / "child", at, {"dp": 3, "grad_accum": 3})
    assert not kept

    def where(p: Path, lo: int) -> dict[int, float]:  # share of the epoch's tokens before it
        tok: dict[int, int] = {}
        pos: dict[int, int] = {}
        for rows in _rows(p, lo):
            for s, ids, lens in zip(
                rows["step"], rows["sample_ids"], rows["seq_lens"], strict=True
            ):
                tok[s] = tok.get(s, 0) + sum(lens)
                pos.update(dict.fromkeys(ids, s))
        steps = sorted(tok)
        before = dict(zip(steps, np.cumsum([0] + [tok[s] for s in steps[:-1]]), strict=True))
        total = sum(tok.values())
        return {i: before[s] / total for i, s in pos.items()}

    a, b = where(plan, at), where(tmp_path / "child", at)
    assert a.keys() == b.keys()
    moved = max(abs(a[i] - b[i]) for i in a)
    # The parent trains a sample within one of its windows (4 steps of 4 x 2 micro-batches) of
    # its place in the stream, the child within two of its own (4 steps of 3 x 3) of that place.
    left = sum(sum(r) for rows in _rows(plan, at) for r in rows["seq_lens"])
    window = (2 * 4 * 3 * 3 + 4 * 4 * 2) * 2048 / left
    assert moved <= window, (moved, window)


def test_what_a_replan_cannot_change_is_refused_in_one_line(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "plan", "--dp", 2, "--grad-accum", 2, "--order", "shuffle")
    for options, words in [
        ({"order": "curriculum"}, "--order curriculum: a replan continues the run"),
        ({"seed": 9}, "--seed stays 0"),
        ({"epochs": 3}, "--epochs stays 1"),
        ({"max_tokens": 64}, "keep a budget of at least the longest remaining sample"),
        ({"warmup": "reorder"}, "holds no warm-up prefix; warm up at run time"),
        ({"dp": 3, "max_shapes": 4}, "--max-shapes chooses its lengths from the whole plan"),
    ]:
        with pytest.raises(ConfigError, match=words):
            replan(plan, tmp_path / "x", 3, options)
    assert not (tmp_path / "x").exists()
    out = cli("replan", plan, tmp_path / "x", "--from-step", 10**6, expect=2)
    assert "has nothing left to replan" in out.stderr and not (tmp_path / "x").exists()
    out = cli("replan", plan, plan, "--from-step", 1, "--overwrite", expect=2)
    assert "is the input" in out.stderr


def test_validate_names_a_wrong_or_moved_parent(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "plan", "--dp", 2, "--grad-accum", 2)
    cli("replan", plan, tmp_path / "child", "--from-step", 4, "--dp", 4)
    out = cli("inspect", tmp_path / "child").stdout
    assert "continues" in out and "from step 4" in out and "dp 2 x grad-accum 2 -> dp 4" in out
    plan.rename(tmp_path / "moved")
    out = cli("validate", tmp_path / "child", expect=1).stdout
    assert "cannot be read" in out and "--parent" in out
    cli("validate", tmp_path / "child", "--parent", tmp_path / "moved")
    cli("plan", tmp_path / "meta", plan, *BASE, "--dp", 2, "--grad-accum", 2, "--seed", 5)
    out = cli("validate", tmp_path / "child", expect=1).stdout
    assert "not the plan this one continues" in out


def test_split_and_carried_plans_replan_and_validate_with_their_metadata(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    n = 1500
    ids = rng.permutation(10 * n)[:n]
    lens = rng.integers(16, 1500, n)
    lens[:25] = rng.integers(2049, 6000, 25)  # documents over the budget: split into pieces
    source = np.array(["web", "code", "books"])[rng.integers(0, 3, n)]
    write_metadata(tmp_path / "meta" / "m.parquet", ids, lens, source=source)
    plan = tmp_path / "plan"
    cli("plan", tmp_path / "meta", plan, *BASE, "--dp", 2, "--grad-accum", 2, "--order",
        "shuffle", "--oversize", "split", "--carry", "source", "--epochs", 2)  # fmt: skip
    steps = load_plan(plan).num_steps
    for at in (1, steps // 3, steps - 1):  # documents' pieces straddle the step
        cli("replan", plan, tmp_path / f"c{at}", "--from-step", at, "--dp", 4, "-q")
        cli("validate", tmp_path / f"c{at}", "--metadata", tmp_path / "meta")
    for at in (3, steps // 2):  # planned again: the pieces left keep their offsets
        replan(plan, tmp_path / f"again{at}", at, {"dp": 3})
        report = validate_plan(tmp_path / f"again{at}", load_ids(tmp_path))
        assert not report.problems, report.problems
    carried = tmp_path / "carried"
    cli("plan", tmp_path / "meta", carried, *BASE, "--dp", 2, "--grad-accum", 2, "--order",
        "shuffle", "--oversize", "drop", "--carry", "source")  # fmt: skip
    cli("replan", carried, tmp_path / "cc", "--from-step", 5, "--dp", 3, "-q")  # planned again
    out = cli("validate", tmp_path / "cc", "--metadata", tmp_path / "meta").stdout
    assert "carried source (checked against the metadata)" in out


@pytest.mark.parametrize("options", [{"dp": 4}, {"dp": 3, "grad_accum": 3}])
def test_a_replan_is_deterministic_and_leaves_its_parent_alone(
    tmp_path: Path, options: dict[str, int]
) -> None:
    plan = _plan(tmp_path, "plan", "--dp", 2, "--grad-accum", 2, "--order", "shuffle")
    before = {p.name: p.read_bytes() for p in plan.iterdir()}
    replan(plan, tmp_path / "a", 9, options)
    replan(plan, tmp_path / "b", 9, options)
    for f in (tmp_path / "a").iterdir():
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name
    assert {p.name: p.read_bytes() for p in plan.iterdir()} == before
    out = cli("validate", tmp_path / "a", "--metadata", tmp_path / "meta", "--replay", expect=2)
    assert "a replanned plan" in out.stderr and "without --replay" in out.stderr


def test_rebalance_plans_again_where_kept_steps_would_not_level(tmp_path: Path) -> None:
    """Micro-batches composed for grad-accum 4 (a rank with a long sample got lighter ones) do
    not level over grad-accum 1; --rebalance plans what is left for the new layout."""
    rng = np.random.default_rng(0)
    n = 20_000
    lens = np.minimum(rng.lognormal(6.1, 0.9, n).astype(np.int64) + 1, 16384)
    lens[rng.choice(n, 60, replace=False)] = rng.integers(12000, 16385, 60)  # the long tail
    write_metadata(tmp_path / "meta" / "m.parquet", np.arange(n), lens)
    cli("plan", tmp_path / "meta", tmp_path / "plan", "--max-tokens", 16384, "--dp", 4,
        "--grad-accum", 4, "--order", "shuffle", "--cost", "flops", "--model-preset",
        "qwen2.5-0.5b", "-q")  # fmt: skip
    out = cli("replan", tmp_path / "plan", tmp_path / "kept", "--from-step", 3, "--dp", 16)
    kept = json.loads((tmp_path / "kept" / "plan.json").read_text())["stats"]["time_vs_ideal"]
    assert "--rebalance" in out.stderr and kept > 1.02
    cli("replan", tmp_path / "plan", tmp_path / "again", "--from-step", 3, "--dp", 16,
        "--rebalance", "-q")  # fmt: skip
    again = json.loads((tmp_path / "again" / "plan.json").read_text())["stats"]["time_vs_ideal"]
    assert again < kept - 0.02
    assert not validate_plan(tmp_path / "again").problems
