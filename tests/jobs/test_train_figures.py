"""jobs/train.py's figures add up: one step count in its log lines, metrics.jsonl, checkpoints
and --max-steps (step S is the run's S-th optimizer step, from 1, across resumes); the final
line counts this run's own steps and tokens; --record keeps one file per rank and run segment
and never leaves another run's looking current; plural forms right.

train.py runs in this process (its ``main``, one rank on a dp 1 plan): no torch start-up per run.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.nn")

from job_helpers import LAUNCH, make_data, metrics  # noqa: E402
from testkit import cli, load_train  # noqa: E402

from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402
from varpack.torch.checkpoint import load_checkpoint  # noqa: E402
from varpack.torch.records import Records  # noqa: E402

#: a count that takes the singular, written in the plural (or the other way round)
WRONG_NUMBER = re.compile(r"(?<![\d,.])(1 (steps|ranks|tokens|shapes|micro-batches)|"
                          r"([02-9]|\d\d+) (step|rank|token|shape|micro-batch)\b(?! \d))")  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("figures"), ("plan", 1))


@pytest.fixture(scope="module")
def trainer() -> Any:
    return load_train("varpack_jobs_train_figures")


@pytest.fixture
def train(data: Path, trainer: Any, capsys: pytest.CaptureFixture[str],
          monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]  # fmt: skip
    """``train(out, *options)``: run train.py on the plan as one process; its stdout lines."""
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)

    def run(out: Path, *options: object, plan: Path | None = None) -> list[str]:
        capsys.readouterr()
        plan = plan or data / "plan"
        code = trainer.main(["--plan", str(plan), "--data", str(data / "tok.arrow"),
                             "--out", str(out), "--warmup-steps", "2", *map(str, options)])  # fmt: skip
        said = capsys.readouterr()
        assert code == 0 and not said.err, said.err
        assert not WRONG_NUMBER.search(said.out), WRONG_NUMBER.search(said.out)
        return said.out.splitlines()

    return run


def _logged(lines: list[str]) -> list[tuple[int, float]]:
    return [(int(m[1]), float(m[2])) for x in lines if (m := re.match(r"\[train\] step +(\d+)  loss (\S+)", x))]  # fmt: skip


def _done(lines: list[str]) -> re.Match[str]:
    m = re.match(r"\[train\] done: (\d+) steps?(?: \(steps (\d+) to (\d+) of the run\))? in "
                 r"[\d.]+s; ([\d,]+) tokens? in all .* \((\d+) ranks?\)$", lines[-1])  # fmt: skip
    assert m, lines[-1]
    return m


def _ids_by_step(data: Path, steps: int) -> list[int]:
    """The sample ids of the plan's first ``steps`` steps, in the order the loader gives them."""
    loader = PlanLoader(data / "plan", ParquetTokenDataset(data / "tok.arrow"), rank=0)
    return [i for b in loader if b.step < steps for i in b.sample_ids.tolist()]


def test_one_step_count_in_the_log_the_metrics_and_the_checkpoint(
    train: Any, data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    first = train(out, "--max-steps", 3, "--log-every", 2, "--record")
    assert [s for s, _ in _logged(first)] == [2, 3]  # every 2nd step, and the last one
    assert [(m["step"], m["plan_step"]) for m in metrics(out)] == [(2, 1), (3, 2)]
    assert [round(m["loss"], 4) for m in metrics(out)] == [v for _, v in _logged(first)]
    assert load_checkpoint(out / "checkpoint.pt")["steps_done"] == 3
    done = _done(first)
    assert (done[1], done[2], done[5]) == ("3", None, "1")  # a first run: no "steps A to B"
    shutil.copy(out / "checkpoint.pt", tmp_path / "step3.pt")

    rest = train(out, "--resume", "--steps", 2, "--record")
    assert re.fullmatch(r"\[train\] resumed after step 3 \(3 of the plan's \d+ steps done in "
                        r"epoch 0, \d+ steps left in this pass\)", rest[0]), rest[0]  # fmt: skip
    assert [s for s, _ in _logged(rest)] == [4, 5]
    logged = metrics(out)
    assert [m["step"] for m in logged] == [2, 3, 4, 5]  # appended, numbered on
    done = _done(rest)  # this run's steps and tokens, named in the run's count
    assert (done[1], done[2], done[3]) == ("2", "4", "5")
    assert int(done[4].replace(",", "")) == sum(m["tokens"] for m in logged[2:])
    assert load_checkpoint(out / "checkpoint.pt")["steps_done"] == 5

    # one record per rank and run segment; together, the plan's first 5 steps exactly
    records = Records(out).read()
    assert [(r["first_step"], r["steps_done"], r["rank"]) for r in records] == [
        (1, 3, 0),
        (4, 5, 0),
    ]
    assert records[0]["sample_ids"] + records[1]["sample_ids"] == _ids_by_step(data, 5)

    # back to the step-3 checkpoint: what was trained after it is forgotten, then trained again
    shutil.copy(tmp_path / "step3.pt", out / "checkpoint.pt")
    again = train(out, "--resume", "--steps", 1, "--record")
    assert [s for s, _ in _logged(again)] == [4] and [m["step"] for m in metrics(out)] == [2, 3, 4]
    assert [(r["first_step"], r["steps_done"]) for r in Records(out).read()] == [(1, 3), (4, 4)]
    assert sorted(p.name for p in out.glob("record-*")) == [
        "record-steps-1-3-rank-0.json", "record-steps-4-4-rank-0.json"]  # fmt: skip
    assert again[-1].startswith("[train] done: 1 step (steps 4 to 4 of the run) in ")


def test_a_new_run_removes_another_runs_records(train: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    for name in ("record-rank-0.json", "record-rank-1.json", "record-steps-1-9-rank-1.json"):
        (out / name).write_text("{}")  # an earlier run's, never checkpointed (or older names)
    (out / "notes.txt").write_text("mine")
    lines = train(out, "--max-steps", 1, "--record")
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint.pt", "metrics.jsonl", "notes.txt", "record-steps-1-1-rank-0.json"]  # fmt: skip
    assert re.match(r"\[train\] done: 1 step in [\d.]+s; [\d,]+ tokens in all .*\(1 rank\)$",
                    lines[-1]), lines[-1]  # fmt: skip


def test_plural_forms_at_the_edges(train: Any, data: Path, tmp_path: Path) -> None:
    """1 step left, 1 step done already: every count in its number (the fixture checks every
    line against WRONG_NUMBER)."""
    out = tmp_path / "run"
    plan = tmp_path / "plan"  # a plan of about a sixth of the samples: the edges sooner
    cli("plan", data / "meta", plan, "--where", "sample_id < 200", "--grad-accum", 2,
        "--max-tokens", 96, "--order", "shuffle", "--seed", 3, "-q")  # fmt: skip
    num_steps = PlanLoader(plan, ParquetTokenDataset(data / "tok.arrow"), rank=0).num_steps
    assert num_steps > 2
    train(out, "--max-steps", num_steps - 1, "--log-every", 100, plan=plan)
    last = train(out, "--resume", plan=plan)
    assert last[0].endswith(", 1 step left in this pass)"), last[0]
    assert _done(last)[0].startswith(f"[train] done: 1 step (steps {num_steps} to {num_steps} ")
    idle = train(out, "--resume", "--max-steps", 1, plan=plan)
    assert f"[train] {num_steps} steps done already (--max-steps 1): nothing to run" in idle
    assert _done(idle)[1] == "0"
