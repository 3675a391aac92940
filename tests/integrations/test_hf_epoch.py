"""``VarpackTrainer``'s epoch counter follows the plan's steps: resumed from a checkpoint, the
logged ``epoch`` of every step is the uninterrupted run's, not counted again from 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.nn")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hf_helpers import gpt_loss, make_plans, tiny_gpt  # noqa: E402

from varpack.integrations.hf import VarpackTrainer  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_plans(tmp_path_factory.mktemp("hf_epoch"))


class StopAt(transformers.TrainerCallback):  # type: ignore[misc]
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        control.should_training_stop = state.global_step == self.step


def run(data: dict[str, Path], out: Path, stop: int | None = None, resume: bool = False,
        **kw: Any) -> dict[int, float]:  # fmt: skip
    """Each logged step's epoch."""
    save = dict(save_strategy="steps", save_steps=1) if stop else dict(save_strategy="no")
    args = transformers.TrainingArguments(str(out), use_cpu=True, logging_steps=1,
                                          report_to="none", disable_tqdm=True, **save, **kw)  # fmt: skip
    loader = PlanLoader(data["dp1"], ParquetTokenDataset(data["tokens"]))
    trainer = VarpackTrainer(tiny_gpt(), args, plan_loader=loader, loss_fn=gpt_loss,
                             callbacks=[StopAt(stop)] if stop else None)  # fmt: skip
    trainer.train(resume_from_checkpoint=True if resume else None)
    return {e["step"]: e["epoch"] for e in trainer.state.log_history if "loss" in e}


def test_the_epoch_goes_on_after_a_resume(data: dict[str, Path]) -> None:
    steps = PlanLoader(data["dp1"], ParquetTokenDataset(data["tokens"])).num_steps
    full = run(data, data["tmp"] / "full")
    assert list(full) == list(range(1, steps + 1))
    assert full == {s: s / steps for s in full} and full[steps] == 1.0
    out = data["tmp"] / "stopped"
    first = run(data, out, stop=2)
    second = run(data, out, stop=4, resume=True)  # resumed, stopped again
    third = run(data, out, resume=True)
    assert first == {s: full[s] for s in (1, 2)}
    assert second == {s: full[s] for s in range(1, 5)}  # the checkpoint's history, then 3, 4
    assert third == full


def test_a_run_stopped_early_counts_the_plans_steps(data: dict[str, Path]) -> None:
    steps = PlanLoader(data["dp1"], ParquetTokenDataset(data["tokens"])).num_steps
    got = run(data, data["tmp"] / "early", max_steps=3)
    assert got == {1: 1 / steps, 2: 2 / steps, 3: 3 / steps}
