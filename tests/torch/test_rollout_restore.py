"""``Rollout.restore`` puts outputs back as ``[B, T]`` or as the ``[B, W]`` response part, and
nothing else: another width, outputs not aligned with their micro-batches, or micro-batches of
another rollout are one line each, never an array of the wrong shape."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from varpack.errors import ConfigError, InputError  # noqa: E402
from varpack.online import plan_batch  # noqa: E402
from varpack.torch.rollout import Rollout  # noqa: E402

pytestmark = pytest.mark.torch


def verl(layout: str = "packed") -> tuple[Rollout, list[Any], dict[str, Any]]:
    """Prompts left-padded to 3 columns, responses right-padded in 4 after them."""
    ids = torch.tensor([[0, 1, 2, 11, 12, 0, 0], [1, 2, 3, 11, 12, 13, 14], [0, 0, 1, 11, 0, 0, 0],
                        [0, 1, 2, 11, 12, 13, 0]])  # fmt: skip
    data = {"input_ids": ids, "attention_mask": (ids > 0).long(),
            "response_mask": (ids[:, 3:] > 0).long(), "old_log_probs": -ids[:, 3:] / 10.0}  # fmt: skip
    roll = Rollout(data)
    plan = plan_batch(roll.lengths, dp=2, max_tokens=8, layout=layout)
    return roll, roll.micro_batches(plan, 0, 0) + roll.micro_batches(plan, 1, 0), data


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_the_two_widths_put_back_exactly(layout: str) -> None:
    roll, mbs, data = verl(layout)
    outs = [mb.fields["old_log_probs"] for mb in mbs]
    assert roll.response_width == 4
    assert torch.equal(roll.restore(mbs, outs, width=4), data["old_log_probs"])
    full = roll.restore(mbs, outs)
    assert full.shape == (4, 7) and torch.equal(full, roll.restore(mbs, outs, width=7))
    assert torch.equal(full[:, 3:], data["old_log_probs"]) and (full[:, :3] == 0).all()
    per_token = [torch.stack([o, -o], dim=-1) for o in outs]  # two values a token
    assert roll.restore(mbs, per_token, width=4).shape == (4, 4, 2)


@pytest.mark.parametrize(
    ("width", "said"),
    [
        (
            10,
            "width=10: 7 (the batch's columns, the default) or 4 (the response part, as the "
            "[B, 4] entries)",
        ),  # fmt: skip
        (8, "width=8: 7"),
        (3, "width=3: 7"),
        (-1, "width=-1: 7"),
        (0, "width=0: 7"),
        (4.0, "width=4.0: 7"),
        (True, "width=True: 7"),
    ],
)
def test_another_width_is_one_line(width: Any, said: str) -> None:
    roll, mbs, _ = verl()
    with pytest.raises(ConfigError, match=f"^{re.escape(said)}"):
        roll.restore(mbs, [mb.fields["old_log_probs"] for mb in mbs], width=width)


def test_a_rollout_without_a_response_part_restores_its_whole_width() -> None:
    roll = Rollout([torch.arange(1, n + 1) for n in (5, 3, 8, 2)])
    plan = plan_batch(roll.lengths, dp=1, max_tokens=20)
    mbs = roll.micro_batches(plan, 0, 0)
    outs = [mb.input_ids.float() for mb in mbs]
    assert roll.restore(mbs, outs).shape == (4, 8)
    with pytest.raises(ConfigError, match=r"^width=3: 8 \(the batch's columns, the default\)$"):
        roll.restore(mbs, outs, width=3)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_outputs_of_the_wrong_shape_are_one_line(layout: str) -> None:
    roll, mbs, _ = verl(layout)
    outs = [mb.fields["old_log_probs"] for mb in mbs]
    shape = list(mbs[1].input_ids.shape)
    cases = [
        (outs[:1] + [outs[1][:, :-1]] + outs[2:],
         f"restore: outputs[1] is a tensor of shape {tuple(outs[1][:, :-1].shape)}, but "
         f"batches[1] holds input_ids {shape}: one output per token, aligned with them"),
        (outs[:1] + [outs[1][0]] + outs[2:], "restore: outputs[1] is a tensor of shape"),
        (outs[:1] + [outs[1].tolist()] + outs[2:], "restore: outputs[1] is a list, but"),
        (outs[:1] + [outs[1][..., None].expand(*outs[1].shape, 3)] + outs[2:],
         "restore: outputs[1] holds [3] values a token, outputs[0] []: one shape for all"),
        (outs[:-1], f"restore: {len(mbs)} micro-batches and {len(mbs) - 1} outputs; give at "
                    "least one micro-batch and one output for each"),
        (tuple(outs) + (outs[0],), f"restore: {len(mbs)} micro-batches and {len(mbs) + 1} outputs"),
    ]  # fmt: skip
    for got, said in cases:
        with pytest.raises(InputError, match=f"^{re.escape(said)}"):
            roll.restore(mbs, got, width=4)
    with pytest.raises(InputError, match=r"^restore: 0 micro-batches and 0 outputs"):
        roll.restore([], [])
    with pytest.raises(InputError, match=r"^restore: batches and outputs are lists"):
        roll.restore(mbs[0], outs[0])
    with pytest.raises(InputError, match=r"^restore: batches\[0\] is a dict, not a micro-batch"):
        roll.restore([{}], outs[:1])


def test_micro_batches_of_another_rollout_are_one_line() -> None:
    roll, mbs, _ = verl()
    other = Rollout([torch.arange(1, n + 1) for n in (9, 9, 9, 9, 9, 9)])
    theirs = other.micro_batches(plan_batch(other.lengths, dp=1, max_tokens=64), 0, 0)
    with pytest.raises(InputError, match=r"^restore: batches\[0\] holds samples this rollout "
                       r"does not \(of its 4\): give this rollout's micro_batches$"):  # fmt: skip
        roll.restore(theirs, [mb.input_ids.float() for mb in theirs])
