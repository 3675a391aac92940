"""``Rollout.micro_batches`` runs only a plan of its own batch: as many samples, each with the
tokens the plan gave it (a split sample's pieces summed); any other plan is one line naming the
first sample that differs, never a micro-batch of another sample's tokens."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.online import plan_batch  # noqa: E402
from varpack.torch.rollout import Rollout  # noqa: E402

pytestmark = pytest.mark.torch
LENGTHS = [70, 9, 12, 5, 30, 8, 17, 11]


def rollout(lengths: list[int]) -> Rollout:
    return Rollout([torch.arange(1, n + 1) for n in lengths])


def refused(roll: Rollout, plan: object) -> str:
    with pytest.raises(InputError) as err:
        roll.micro_batches(plan, 0, 0)  # type: ignore[arg-type]
    line = str(err.value)
    assert "\n" not in line
    return line


AGAIN = "plan this rollout's own lengths: plan_batch(rollout.lengths, ...)"


@pytest.mark.parametrize("oversize", ["alone", "split"])
def test_a_plan_of_more_or_fewer_samples_is_refused(oversize: str) -> None:
    roll = rollout(LENGTHS)
    for n in (len(LENGTHS) - 1, len(LENGTHS) + 1, 2):
        lengths = (LENGTHS * 2)[:n]
        plan = plan_batch(lengths, dp=2, max_tokens=40, oversize=oversize)
        assert refused(roll, plan) == (
            f"the plan is of a batch of {n} samples, this rollout holds {len(LENGTHS)}: {AGAIN}"
        )


@pytest.mark.parametrize(
    ("sample", "more", "oversize"),
    [
        (0, 30, "split"),  # the reported case: a split sample 30 tokens longer
        (0, -20, "split"),
        (4, 1, "split"),  # a whole sample of a split plan, one token longer
        (7, 1, "alone"),
        (3, -2, "alone"),
    ],
)
def test_a_plan_where_one_sample_has_other_tokens_is_refused(
    sample: int, more: int, oversize: str
) -> None:
    roll = rollout(LENGTHS)
    other = list(LENGTHS)
    other[sample] += more
    plan = plan_batch(other, dp=2, max_tokens=40, oversize=oversize)
    assert (plan.piece_starts is not None) == (oversize == "split")
    assert refused(roll, plan) == (
        f"sample {sample} has {LENGTHS[sample]} tokens in this rollout but {other[sample]} in "
        f"the plan, which is of another batch: {AGAIN}"
    )


def test_the_same_lengths_in_another_order_name_the_first_that_differs() -> None:
    roll = rollout(LENGTHS)
    plan = plan_batch(LENGTHS[::-1], dp=2, max_tokens=40)
    assert refused(roll, plan).startswith("sample 0 has 70 tokens in this rollout but 11 in")
    assert refused(roll, "plan") == (
        "plan: a BatchPlan of this rollout (plan_batch(rollout.lengths, ...)), not str"
    )


@pytest.mark.parametrize("oversize", ["alone", "split"])
def test_a_plan_of_this_batch_runs_every_token_once(oversize: str) -> None:
    roll = rollout(LENGTHS)
    plan = plan_batch(np.array(LENGTHS), dp=2, max_tokens=40, oversize=oversize)
    seen = np.zeros(len(LENGTHS), np.int64)
    for step in range(plan.num_steps):
        for rank in range(2):
            for mb in roll.micro_batches(plan, rank, step):
                np.add.at(seen, mb.sample_ids.numpy(), mb.seq_lens.numpy())
    assert seen.tolist() == LENGTHS


@pytest.mark.parametrize(("sample", "more"), [(0, 1), (3, 1), (7, 100)])
def test_loss_tokens_beyond_a_sample_are_refused(sample: int, more: int) -> None:
    """More loss tokens than tokens (step_loss_tokens above step_tokens) is no count of a mask."""
    roll = rollout(LENGTHS)
    loss = np.array(LENGTHS) // 2
    plan = plan_batch(LENGTHS, dp=2, max_tokens=40, loss_tokens=loss)
    assert len(roll.micro_batches(plan, 0, 0)) == plan.micro_per_step
    loss[sample] = LENGTHS[sample] + more
    with pytest.raises(
        InputError, match=rf"loss_tokens\[{sample}\] = {LENGTHS[sample] + more} exceeds"
    ):
        plan_batch(LENGTHS, dp=2, max_tokens=40, loss_tokens=loss)  # refused before it plans
    loss[sample] = LENGTHS[sample]  # every token counted: the most there can be
    plan = plan_batch(LENGTHS, dp=2, max_tokens=40, loss_tokens=loss)
    assert len(roll.micro_batches(plan, 1, 0)) == plan.micro_per_step
