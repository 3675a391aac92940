"""jobs/train.py trains with DDP (its ranks meet once per step): a plan balanced for ranks that
meet at every micro-batch (``--sync micro``, the planner's default) is one note line with its time
under both models, said by rank 0; a ``--sync step`` plan, one micro-batch per step or one rank
say nothing. (Under torchrun, once per run: test_train_job.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch.nn")

from testkit import cli, write_metadata  # noqa: E402

from varpack.planfile.format import load_plan  # noqa: E402
from varpack.torch.job import log, sync_note  # noqa: E402


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("train_sync")
    lens = {i: 8 + (i * 37) % 41 for i in range(160)}
    write_metadata(tmp / "meta" / "m.parquet", list(lens), list(lens.values()))
    for name, options in {
        "micro": ["--grad-accum", 2],
        "step": ["--grad-accum", 2, "--sync", "step"],
        "micro-ga1": ["--grad-accum", 1],
    }.items():
        cli("plan", tmp / "meta", tmp / name, "--dp", 2, "--max-tokens", 96, *options, "-q")
    return tmp


def test_a_micro_plan_is_one_note_with_both_times(plans: Path) -> None:
    plan = load_plan(plans / "micro")
    times = plan.meta["stats"]["time_vs_ideal_by_sync"]
    note = sync_note(plan, 2)
    assert note is not None and "\n" not in note
    assert note.startswith(f"note: {plans / 'micro'} was balanced for ranks that meet at every ")
    assert "but DDP meets once per optimizer step: balanced there too" in note
    bound = plan.meta["stats"]["time_vs_ideal_bound"]
    assert note.endswith(f"({times['step']:.3f}x ideal; {times['micro']:.3f}x under micro; no "
                         f"composition of its samples into as many steps below {bound:.3f}x)")  # fmt: skip
    assert "--sync step" not in note.split("but DDP")[1]  # no plan it has not measured
    assert "warning" not in note  # harmless: no warning in the default path


def test_nothing_to_say(plans: Path) -> None:
    assert sync_note(load_plan(plans / "step"), 2) is None  # the plan is DDP's own
    assert sync_note(load_plan(plans / "micro-ga1"), 2) is None  # a slot is the step
    assert sync_note(load_plan(plans / "micro"), 1) is None  # one rank: no one waits


def test_log_says_a_note_on_rank_0_and_nothing_for_none(capsys: pytest.CaptureFixture[str]) -> None:
    log(0, "note: x")
    log(1, "note: y")
    log(0, None)
    assert capsys.readouterr().out == "[train] note: x\n"
