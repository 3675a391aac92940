"""``VarpackTrainer``'s LR schedule follows ``max_steps``, as in any Trainer run, times the plan's
LR factor of each step (indexed by the global step), and a run resumed with a larger
``max_steps`` follows the new schedule from its first resumed step.

The expected LRs are written out here (warm-up, then cosine to 0 at ``max_steps``: what
``lr_scheduler_type="cosine"`` means), not taken from transformers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.nn")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hf_helpers import gpt_loss, make_plans, tiny_gpt  # noqa: E402

from varpack.integrations.hf import VarpackTrainer  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402

pytestmark = pytest.mark.torch
LR, WARMUP = 1e-3, 1


class LRLog(transformers.TrainerCallback):  # type: ignore[misc]
    """The LR each optimizer step uses, by global step (0-based), read as the step begins."""

    def __init__(self) -> None:
        self.lr: dict[int, float] = {}

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.lr[state.global_step] = kw["optimizer"].param_groups[0]["lr"]


def cosine(step: int, max_steps: int, warmup: int = WARMUP) -> float:
    """Linear warm-up over ``warmup`` steps, then half a cosine from 1 to 0 at ``max_steps``."""
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, max_steps - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_plans(tmp_path_factory.mktemp("hf_schedule"))


def run(data: dict[str, Path], out: Path, max_steps: int, resume: bool = False) -> LRLog:
    log = LRLog()
    args = transformers.TrainingArguments(
        str(out), max_steps=max_steps, learning_rate=LR, lr_scheduler_type="cosine",
        warmup_steps=WARMUP, optim="adamw_torch", save_steps=3, report_to="none",
        disable_tqdm=True, use_cpu=True,
    )  # fmt: skip
    loader = PlanLoader(data["dp1"], ParquetTokenDataset(data["tokens"]))
    trainer = VarpackTrainer(tiny_gpt(), args, plan_loader=loader, loss_fn=gpt_loss,
                             callbacks=[log])  # fmt: skip
    trainer.train(resume_from_checkpoint=True if resume else None)
    return log


def test_the_schedule_follows_max_steps_across_a_resume(data: dict[str, Path]) -> None:
    """3 steps of the 6-step plan follow the 3-step cosine (its last at 0.5, not the 0.9 of the
    plan's 6); resumed from checkpoint-3 with max_steps 5, steps 3 and 4 are on the 5-step cosine
    (not the saved LR of the 3-step one, which is 0 at step 3). Every step's LR carries its
    plan factor."""
    loader = PlanLoader(data["dp1"], ParquetTokenDataset(data["tokens"]))
    factors = loader.lr_factors()
    assert loader.num_steps == 6 and len(set(factors[:5].round(6))) > 2  # factors vary
    out = data["tmp"] / "short"
    short = run(data, out, 3)
    assert list(short.lr) == [0, 1, 2]
    for s, lr in short.lr.items():
        assert lr == pytest.approx(LR * cosine(s, 3) * factors[s], rel=1e-9, abs=1e-15), s
    assert short.lr[2] < 0.6 * LR * factors[2]  # decayed over its 3 steps, not the plan's 6
    resumed = run(data, out, 5, resume=True)
    assert list(resumed.lr) == [3, 4]
    for s, lr in resumed.lr.items():
        assert lr == pytest.approx(LR * cosine(s, 5) * factors[s], rel=1e-9), s
    assert resumed.lr[3] > 0.4 * LR * factors[3]  # 0.5 on the 5-step curve
