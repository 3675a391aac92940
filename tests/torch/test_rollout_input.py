"""What ``Rollout`` takes: every entry a tensor or a sequence of the batch's size, token ids and
masks of integer values; anything else one ``VarpackError`` line naming the entry."""

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
