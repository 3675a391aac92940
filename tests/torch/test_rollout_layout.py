"""A rollout's ``[B, W]`` entries land on each row's response tokens, whatever the padding: verl's
layout (prompts left-padded, responses right-padded), right-padded rows, left-padded rows and a
mix, each checked against a mask written out by hand; a layout the masks leave ambiguous, or
that no reading fits, is one line."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.online import plan_batch  # noqa: E402
from varpack.torch.rollout import Rollout  # noqa: E402

pytestmark = pytest.mark.torch
T = torch.tensor


def unpacked(roll: Rollout, name: str, layout: str = "packed") -> torch.Tensor:
    """The entry ``name`` as the micro-batches hold it, put back as ``[B, T]``."""
    plan = plan_batch(roll.lengths, dp=2, max_tokens=12, layout=layout)
    mbs = [mb for rank in range(2) for mb in roll.micro_batches(plan, rank, 0)]
    return roll.restore(mbs, [mb.fields[name] for mb in mbs])


def batch(ids: list[list[int]], mask: list[list[int]], **more: Any) -> dict[str, Any]:
    return {"input_ids": T(ids), "attention_mask": T(mask), **more}


# prompt tokens are 1-digit, response tokens 2-digit: the expected masks are readable off the ids
RIGHT = batch(  # prompt, response, padding
    [[1, 2, 11, 12, 13, 0, 0], [1, 2, 3, 4, 11, 0, 0], [1, 11, 12, 13, 14, 15, 0]],
    [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0]],
    response_mask=T([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]),
    old_log_probs=T([[-1.0, -2.0, -3.0, 9, 9], [-4.0, 9, 9, 9, 9], [-5.0, -6, -7, -8, -9]]),
)
RIGHT_WANT = T([[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0, 0], [0, 1, 1, 1, 1, 1, 0]])
LEFT = batch(  # padding, prompt, response
    [[0, 0, 1, 2, 11, 12, 13], [0, 0, 1, 2, 3, 4, 11], [0, 1, 11, 12, 13, 14, 15]],
    [[0, 0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1]],
    response_mask=RIGHT["response_mask"],
    old_log_probs=RIGHT["old_log_probs"],
)
LEFT_WANT = T([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1], [0, 0, 1, 1, 1, 1, 1]])
MIXED = batch(  # rows 0 and 2 right-padded, row 1 left-padded
    [RIGHT["input_ids"][0].tolist(), LEFT["input_ids"][1].tolist(), [1, 11, 12, 0, 0, 0, 0]],
    [RIGHT["attention_mask"][0].tolist(), LEFT["attention_mask"][1].tolist(),
     [1, 1, 1, 0, 0, 0, 0]],
    response_mask=T([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]),
)  # fmt: skip
MIXED_WANT = T([RIGHT_WANT[0].tolist(), LEFT_WANT[1].tolist(), [0, 1, 1, 0, 0, 0, 0]])


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize(
    ("data", "want"), [(RIGHT, RIGHT_WANT), (LEFT, LEFT_WANT), (MIXED, MIXED_WANT)]
)
def test_the_response_mask_lands_on_each_rows_response(data: Any, want: Any, layout: str) -> None:
    roll = Rollout(data)
    assert torch.equal(unpacked(roll, "response_mask", layout), want)
    assert roll.loss_tokens().tolist() == want.sum(dim=1).tolist()
    assert ((data["input_ids"] >= 11) == want.bool()).all()  # on the response tokens exactly
    # and back: restore(width=W) of what the micro-batches hold is the [B, W] entry
    plan = plan_batch(roll.lengths, dp=1, max_tokens=32, layout=layout)
    mbs = roll.micro_batches(plan, 0, 0)
    back = roll.restore(mbs, [mb.fields["response_mask"] for mb in mbs], width=5)
    assert roll.response_width == 5 and torch.equal(back, data["response_mask"])


def test_per_token_values_of_right_padded_rows_land_on_their_tokens() -> None:
    roll = Rollout(RIGHT)
    got = unpacked(roll, "old_log_probs")
    want = torch.zeros(3, 7)
    want[0, 2:5] = T([-1.0, -2.0, -3.0])
    want[1, 4] = -4.0
    want[2, 1:6] = T([-5.0, -6, -7, -8, -9])
    assert torch.equal(got, want)  # the 9s sit past each row's end: on no token


def test_the_reported_batch_counts_every_response_token() -> None:
    """Right-padded rows of random prompts and responses: the loss tokens are the responses'
    (the response mask laid on the last W columns counted fewer, on prompts and padding)."""
    rng = np.random.default_rng(7)
    prompts, responses = rng.integers(2, 10, 12), rng.integers(1, 20, 12)
    t, w = int((prompts + responses).max()), int(responses.max())
    ids, mask = torch.zeros(12, t, dtype=torch.long), torch.zeros(12, t, dtype=torch.long)
    marks = torch.zeros(12, w, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts.tolist(), responses.tolist(), strict=True)):
        ids[i, :p], ids[i, p : p + r] = 1, 2
        mask[i, : p + r], marks[i, :r] = 1, 1
    roll = Rollout({"input_ids": ids, "attention_mask": mask, "response_mask": marks})
    assert roll.loss_tokens().tolist() == responses.tolist()
    assert torch.equal(unpacked(roll, "response_mask").bool(), ids == 2)


def test_verl_layout_keeps_its_reading_with_holes_in_the_response_mask() -> None:
    """verl's layout (multi-turn: tool tokens unmarked, some at a response's end): the response
    starts at column P whatever the response mask marks, a row padded on both sides tells."""
    data = batch(
        [[0, 1, 2, 11, 12, 13, 0], [1, 2, 3, 11, 12, 0, 0], [0, 0, 1, 11, 12, 13, 14]],
        [[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]],
        response_mask=T([[1, 0, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]]),  # holes, unmarked ends
        responses=T([[11, 12, 13, 0], [11, 12, 0, 0], [11, 12, 13, 14]]),
        prompts=T([[0, 1, 2], [1, 2, 3], [0, 0, 1]]),
    )
    roll = Rollout(data)
    want = T([[0, 0, 0, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 1, 0, 0]])
    assert torch.equal(unpacked(roll, "response_mask"), want)
    assert torch.equal(unpacked(roll, "responses"), data["input_ids"] * (data["input_ids"] > 10))
    assert torch.equal(unpacked(roll, "prompts"), data["input_ids"] * (data["input_ids"] < 10))


def test_responses_tell_where_both_readings_fit() -> None:
    """Right-padded rows of prompts 2 and 3 tokens, all at least P long: verl's reading (prompts
    of P = 2, unmarked response ends) fits too; the response mask's is taken, and responses, when
    given, must be the tokens there; when they are verl's, verl's reading is taken."""
    data = batch(
        [[1, 2, 11, 12, 13], [1, 2, 3, 11, 0], [1, 2, 11, 12, 0]],
        [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0]],
        response_mask=T([[1, 1, 1], [1, 0, 0], [1, 1, 0]]),
    )
    want = T([[0, 0, 1, 1, 1], [0, 0, 0, 1, 0], [0, 0, 1, 1, 0]])
    assert torch.equal(unpacked(Rollout(data), "response_mask"), want)
    roll = Rollout({**data, "responses": T([[11, 12, 13], [11, 0, 0], [11, 12, 0]])})
    assert torch.equal(unpacked(roll, "response_mask"), want)
    verl = Rollout({**data, "responses": T([[11, 12, 13], [3, 11, 0], [11, 12, 0]])})
    assert torch.equal(unpacked(verl, "response_mask"), T([[0, 0, 1, 1, 1], [0, 0, 1, 0, 0],
                                                           [0, 0, 1, 1, 0]]))  # fmt: skip
    with pytest.raises(InputError) as err:
        Rollout({**data, "responses": T([[11, 12, 13], [7, 0, 0], [11, 12, 0]])})
    assert str(err.value) == (
        "row 1: responses are not its tokens from column 3, where its response starts (the last "
        "mark of its response_mask on its last token); give responses that hold each row's "
        "response tokens, or rows in verl's layout: prompts left-padded to one length, "
        "responses right-padded after them"
    )


def test_left_padded_rows_all_longer_than_the_response_part() -> None:
    """Every row at least W long and ending at column T: verl's reading would make every
    response W tokens with unmarked ends; the response mask's is taken."""
    data = batch(
        [[0, 1, 2, 3, 11, 12], [1, 2, 3, 4, 5, 11], [0, 0, 1, 11, 12, 13]],
        [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]],
        response_mask=T([[1, 1, 0], [1, 0, 0], [1, 1, 1]]),
    )
    want = T([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 1, 1]])
    assert torch.equal(unpacked(Rollout(data), "response_mask"), want)


def test_the_name_of_the_response_mask_is_an_option() -> None:
    data = {k: v for k, v in RIGHT.items() if k != "response_mask"}
    data["action_mask"] = RIGHT["response_mask"]
    with pytest.raises(InputError, match="give response_mask \\[B, 5\\] \\(1 on its"):
        Rollout(data)
    roll = Rollout(data, response_mask="action_mask")
    assert torch.equal(unpacked(roll, "action_mask"), RIGHT_WANT)
    assert roll.loss_tokens("action_mask").tolist() == [3, 1, 5]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"response_mask": None},  # right-padded rows and nothing that marks the response
            "where each row's response starts is ambiguous: no row is padded on both sides, as "
            "in verl's layout: prompts left-padded to one length, responses right-padded after "
            "them, and no response_mask marks the responses next to old_log_probs [B, 5]; give "
            "response_mask [B, 5] (1 on its response tokens) or responses [B, 5] (their token "
            "ids)",
        ),
        (
            {
                "response_mask": None,  # row 2 ends before column P = 2
                "input_ids": T([[1, 2, 11, 0, 0, 0, 0]] * 2 + [[11] + [0] * 6]),
                "attention_mask": T([[1, 1, 1, 0, 0, 0, 0]] * 2 + [[1] + [0] * 6]),
            },
            "row 2 (old_log_probs [B, 5] next to attention_mask [B, 7]) is not in verl's "
            "layout: prompts left-padded to one length, responses right-padded after them in 2 "
            "columns, so where its response starts is unknown: give response_mask [B, 5], 1 on "
            "its response tokens, or rows in verl's layout",
        ),
        (
            {
                "attention_mask": T(
                    [[1, 0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0]]
                )
            },  # fmt: skip
            "row 0 of attention_mask has padding between real tokens, but a [B, 5] entry "
            "(response_mask) holds each row's response, its tokens in one run at the row's end",
        ),
        (
            {
                "input_ids": MIXED["input_ids"],
                "attention_mask": MIXED["attention_mask"],
                "response_mask": T([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]]),
            },  # fmt: skip
            "row 2: response_mask marks 4 columns ending on its last real token, more than its "
            "3 real tokens (attention_mask), and the rows are not in verl's layout",
        ),
        (
            {"advantages": torch.zeros(3, 1)},
            "advantages is [B, 1] and old_log_probs [B, 5]: every [B, W] entry holds one value "
            "per response token, one W for all (per-sample values: [B])",
        ),
        (
            {"response_mask": torch.ones(3, 5, 2, dtype=torch.long)},
            "response_mask: (3, 5, 2), not a [B, 5] mask of the response part",
        ),
    ],
)
def test_a_layout_no_reading_fits_is_one_line(change: dict[str, Any], said: str) -> None:
    data = {k: v for k, v in {**RIGHT, **change}.items() if v is not None}
    with pytest.raises(InputError) as err:
        Rollout(data)
    assert str(err.value).startswith(said), str(err.value)


def test_entries_of_the_whole_width_need_no_reading() -> None:
    """[B, T] entries are per token wherever the padding is; a [B, T] response mask too."""
    data = batch(RIGHT["input_ids"].tolist(), RIGHT["attention_mask"].tolist(),
                 response_mask=RIGHT_WANT, position_ids=torch.arange(7).expand(3, 7))  # fmt: skip
    roll = Rollout(data)
    assert roll.response_width is None
    assert torch.equal(unpacked(roll, "response_mask"), RIGHT_WANT)
    assert roll.loss_tokens().tolist() == [3, 1, 5]
