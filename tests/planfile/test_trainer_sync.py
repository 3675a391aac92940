"""The plan's ``sync`` against the trainer's: a warning where the plan's balance understates the
wait (a ``step`` plan under sharded parameters), an informative line the other way round, and
nothing where no one waits or the two models are the same (one micro-batch per step)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from testkit import cli, write_metadata

from varpack.planfile.trainer_sync import SyncAdvice, plan_sync, sync_advice

TIMES = {"step": 1.0123, "micro": 1.0987}


def meta(sync: str | None, grad_accum: int, times: dict[str, float] | None = TIMES) -> dict:
    """plan.json's content as far as the advice reads it (``sync`` None: a plan from before
    ``--sync``, which records no time per model either)."""
    config = {} if sync is None else {"sync": sync}
    stats: dict[str, Any] = {"time_vs_ideal": (times or {}).get(sync or "step", 1.0123)}
    if sync is not None and times is not None:
        stats["time_vs_ideal_by_sync"] = times
    return {"config": config, "layout": {"dp": 4, "grad_accum": grad_accum}, "stats": stats}


@pytest.mark.parametrize(
    ("planned", "trainer", "world", "grad_accum"),
    list(itertools.product(["micro", "step", None], ["micro", "step", None], [1, 2, 8], [1, 4])),
)
def test_every_combination(planned: str | None, trainer: str | None, world: int,
                           grad_accum: int) -> None:  # fmt: skip
    got = sync_advice("plan/", meta(planned, grad_accum), trainer, "the trainer", world)
    balanced_for = planned or "step"  # a plan from before --sync was balanced per step
    if world == 1 or grad_accum == 1 or trainer is None or trainer == balanced_for:
        assert got is None  # no one waits, the models agree, or the trainer is unknown
        return
    assert isinstance(got, SyncAdvice) and "\n" not in got.text
    assert got.harmful == (trainer == "micro")  # only a step plan under sharding costs time
    assert (
        got.text.startswith("plan/ was balanced for ranks that meet ") and "the trainer" in got.text
    )


def test_harmful_line_gives_the_time_under_micro_and_the_commands() -> None:
    text = sync_advice("runs/plan", meta("step", 4), "micro", "DeepSpeed ZeRO-3", 8).text
    assert "(--sync step), but DeepSpeed ZeRO-3 meets at every micro-batch" in text
    assert "takes 1.099x the ideal time, not the 1.012x the plan was balanced to" in text
    assert "varpack plan INPUT OUT --sync micro" in text
    assert "varpack replan runs/plan OUT --from-step S --sync micro" in text


def test_a_plan_from_before_sync_under_sharding_still_warns() -> None:
    got = sync_advice("old/", meta(None, 2, None), "micro", "FSDP", 2)
    assert got is not None and got.harmful
    assert "(--sync step)" in got.text and "takes more than the 1.012x" in got.text


def test_harmless_line_gives_both_times_and_no_command() -> None:
    got = sync_advice("p", meta("micro", 4), "step", "DDP", 2)
    assert got is not None and not got.harmful
    assert "DDP meets once per optimizer step: balanced there too (1.012x ideal; 1.099x" in got.text
    assert "--sync step" not in got.text and "varpack plan" not in got.text
    bare = sync_advice("p", meta("micro", 4, {}), "step", "DDP", 2)
    assert bare is not None and bare.text.endswith("balanced there too")  # no figures, no guess


def test_real_plans_figures(tmp_path: Path) -> None:
    """The figures said are the plan.json's of a plan made by ``varpack plan``, each model's."""
    lens = {i: 8 + (i * 37) % 41 for i in range(160)}
    write_metadata(tmp_path / "meta" / "m.parquet", list(lens), list(lens.values()))
    for sync in ("step", "micro"):
        cli("plan", tmp_path / "meta", tmp_path / sync, "--dp", 2, "--grad-accum", 2,
            "--max-tokens", 96, "--sync", sync, "-q")  # fmt: skip
    step = json.loads((tmp_path / "step" / "plan.json").read_text())
    micro = json.loads((tmp_path / "micro" / "plan.json").read_text())
    assert (plan_sync(step), plan_sync(micro)) == ("step", "micro")
    warned = sync_advice("s", step, "micro", "FSDP", 2)
    times = step["stats"]["time_vs_ideal_by_sync"]
    assert warned is not None and f"takes {times['micro']:.3f}x" in warned.text
    assert f"not the {times['step']:.3f}x" in warned.text
    noted = sync_advice("m", micro, "step", "DDP", 2)
    times = micro["stats"]["time_vs_ideal_by_sync"]
    assert noted is not None and f"({times['step']:.3f}x ideal; {times['micro']:.3f}x" in noted.text
    assert sync_advice("s", step, "step", "DDP", 2) is None
    assert sync_advice("m", micro, "micro", "FSDP", 2) is None
