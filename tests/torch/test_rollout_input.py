"""What ``Rollout`` takes: every entry a tensor or a sequence of the batch's size, token ids and
masks of integer values; anything else one ``VarpackError`` line naming the entry."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from varpack.errors import ConfigError, InputError  # noqa: E402
from varpack.online import plan_batch  # noqa: E402
from varpack.torch.rollout import Rollout  # noqa: E402

pytestmark = pytest.mark.torch


def small() -> dict[str, Any]:
    """Two rows of five columns, one left-padded and one right-padded."""
    ids = torch.tensor([[0, 5, 6, 7, 8], [3, 4, 5, 6, 0]])
    return {"input_ids": ids, "attention_mask": (ids > 0).long()}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (1.5, "a float"),
        (7, "a int"),
        (torch.tensor(2.0), "a tensor of shape ()"),
        (None, "None"),
        ("ab", "a str"),  # a string has a length, but is no per-sample entry
        ({"a": 1, "b": 2}, "a dict"),
        (np.float64(3.0), "a float64"),
        (np.array(3), "a NumPy array of shape ()"),
        (torch.zeros(3, 5), "a tensor of shape (3, 5)"),  # another batch's rows
    ],
)
def test_an_entry_that_is_no_tensor_or_sequence_is_one_line(value: Any, said: str) -> None:
    with pytest.raises(InputError) as err:
        Rollout({**small(), "x": value})
    line = str(err.value)
    assert line.startswith(f"x: {said} for a batch of 2 samples; give a tensor [2, T]"), line
    assert "\n" not in line


@pytest.mark.parametrize("value", [torch.zeros(3), [1, 2, 3], (1,), np.zeros(5)])
def test_a_sequence_of_another_length_is_one_line(value: Any) -> None:
    with pytest.raises(InputError, match=f"^x: {len(value)} entries for a batch of 2 samples$"):
        Rollout({**small(), "x": value})


@pytest.mark.parametrize("key", ["input_ids", "attention_mask"])
@pytest.mark.parametrize("value", [None, 3.0, [[1, 2], [3, 4]], torch.ones(4, dtype=torch.long)])
def test_ids_and_mask_must_be_two_dimensional_tensors(key: str, value: Any) -> None:
    with pytest.raises(InputError, match=f"^{key}: a \\[batch, length\\] tensor, not "):
        Rollout({**small(), key: value})


def test_per_sample_entries_of_every_kind_are_carried() -> None:
    data = {**small(), "uid": ["a", "b"], "score": torch.tensor([0.5, 1.5]),
            "tags": np.array([[1, 2], [3, 4]]), "pair": (7, 8)}  # fmt: skip
    roll = Rollout(data)
    assert roll.lengths.tolist() == [4, 4]
    (mb,) = roll.micro_batches(plan_batch(roll.lengths, dp=1, max_tokens=8), 0, 0)
    order = mb.sample_ids.tolist()
    assert mb.carry["uid"] == [data["uid"][i] for i in order]
    assert mb.carry["score"].tolist() == [data["score"][i].item() for i in order]
    assert [t.tolist() for t in mb.carry["tags"]] == [data["tags"][i].tolist() for i in order]
    assert mb.carry["pair"] == [data["pair"][i] for i in order]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bool])
def test_token_ids_of_a_float_or_boolean_dtype_are_refused(dtype: torch.dtype) -> None:
    data = small()
    ids = data["input_ids"].to(dtype)
    if dtype.is_floating_point:
        ids = ids + 0.5  # fractions: cut to other ids before
    with pytest.raises(InputError, match=f"^input_ids: {dtype}, but it holds token ids"):
        Rollout({**data, "input_ids": ids})
    with pytest.raises(InputError, match=rf"^rollout\[1\]: {dtype}, but it holds token ids"):
        Rollout([torch.arange(1, 4), ids[1], ids[0]])  # the list form too
    for name, width in (("responses", 2), ("position_ids", 5), ("prompts", 3)):
        with pytest.raises(InputError, match=f"^{name}: {dtype}, but it holds token ids"):
            Rollout({**data, name: torch.ones(2, width, dtype=dtype)})


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_token_ids_of_any_integer_dtype_are_taken(dtype: torch.dtype) -> None:
    data = small()
    roll = Rollout({**data, "input_ids": data["input_ids"].to(dtype)})
    assert roll.lengths.tolist() == [4, 4]
    assert Rollout([t.to(dtype) for t in data["input_ids"]]).lengths.tolist() == [5, 5]


@pytest.mark.parametrize("name", ["attention_mask", "response_mask"])
def test_a_mask_is_boolean_or_zeros_and_ones(name: str) -> None:
    data = small()
    data["response_mask"] = data["attention_mask"][:, 3:].clone()
    for ok in (data[name].bool(), data[name].to(torch.int32), data[name].to(torch.uint8)):
        Rollout({**data, name: ok})
    twos = data[name] * 2  # the first 2 in row order: row 0's first real token
    first = int(data[name][0].argmax())
    with pytest.raises(InputError, match=rf"^{name}\[0, {first}\] = 2: a mask holds 0 or 1"):
        Rollout({**data, name: twos})
    negative = data[name].clone()
    negative[1, -1] = -1
    with pytest.raises(InputError, match=rf"^{name}\[1, {negative.shape[1] - 1}\] = -1: a mask"):
        Rollout({**data, name: negative})
    for dtype in (torch.float32, torch.bfloat16):
        with pytest.raises(InputError, match=f"^{name}: {dtype}, but a mask is boolean"):
            Rollout({**data, name: data[name].to(dtype)})


def test_other_per_token_entries_keep_any_dtype() -> None:
    data = {**small(), "old_log_probs": -torch.rand(2, 2), "values": torch.rand(2, 5).half(),
            "response_mask": torch.tensor([[1, 1], [1, 0]])}  # fmt: skip
    Rollout(data)


def test_loss_tokens_of_an_entry_that_is_no_mask_is_one_line() -> None:
    data = {**small(), "response_mask": torch.tensor([[1, 1], [1, 0]]),
            "old_log_probs": -torch.rand(2, 2), "responses": torch.tensor([[7, 8], [6, 0]])}  # fmt: skip
    roll = Rollout(data)
    assert roll.loss_tokens().tolist() == [2, 1]
    with pytest.raises(InputError, match=r"^loss_tokens\('missing'\): this rollout has no "
                       "per-token entry 'missing'; it has input_ids, old_log_probs, "
                       "response_mask, responses$"):  # fmt: skip
        roll.loss_tokens("missing")
    with pytest.raises(InputError, match=r"^loss_tokens\('old_log_probs'\): old_log_probs is no "
                       r"0/1 mask \(torch.float32\); count a mask such as response_mask$"):  # fmt: skip
        roll.loss_tokens("old_log_probs")
    # responses: token ids; row 0's response starts at column 3 (its prompt is columns 1-2)
    with pytest.raises(InputError, match=r"^loss_tokens\('responses'\): responses is no 0/1 mask "
                       r"\(row 0, column 3 holds 7\)"):  # fmt: skip
        roll.loss_tokens("responses")
    with pytest.raises(InputError, match="no per-token entry 'response_mask'; it has input_ids$"):
        Rollout([torch.arange(1, 4)]).loss_tokens()  # the list form holds token ids only


@pytest.mark.parametrize(
    ("rank", "step", "said"),
    [
        (0, 2, "step=2 is not one of the plan's steps 0..1"),
        (0, -1, "step=-1 is not one of the plan's steps 0..1"),  # no counting from the end
        (0, 1.0, "step=1.0 is not one of the plan's steps 0..1"),
        (0, True, "step=True is not one of the plan's steps 0..1"),
        (0, None, "step=None is not one of the plan's steps 0..1"),
        (2, 0, "rank=2 is not one of the plan's dp=2 ranks 0..1"),
        (-1, 0, "rank=-1 is not one of the plan's dp=2 ranks 0..1"),
        ("0", 0, "rank='0' is not one of the plan's dp=2 ranks 0..1"),
    ],
)
def test_a_step_or_rank_outside_the_plan_is_one_line(rank: Any, step: Any, said: str) -> None:
    roll = Rollout([torch.arange(1, n + 1) for n in (5, 3, 8, 2, 6, 4, 7, 3)])
    plan = plan_batch(roll.lengths, dp=2, max_tokens=16, mini_batches=2)
    assert plan.num_steps == 2
    with pytest.raises(ConfigError, match=f"^{re.escape(said)}$"):
        roll.micro_batches(plan, rank, step)
    for s in (0, np.int64(1)):  # NumPy integers are steps too
        assert len(roll.micro_batches(plan, np.int32(1), s)) == plan.micro_per_step
