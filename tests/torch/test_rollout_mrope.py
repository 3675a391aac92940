"""mRoPE positions as verl holds them for Qwen2-VL, ``position_ids`` ``[B, 3, T]``: packed per
sample along the last axis, ``[3, 1, N]`` (padded layout ``[3, B, T]``), each sample's three
streams its own; other shapes are one line."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.online import plan_batch  # noqa: E402
from varpack.torch.rollout import PackedRollout, Rollout  # noqa: E402

pytestmark = pytest.mark.torch


def mrope_batch(k: int = 3) -> dict[str, torch.Tensor]:
    """verl's layout (prompts left-padded to 4, responses right-padded in 3); stream ``s`` of
    row ``i`` holds ``1000 * s + 100 * i + column``, so every value says where it came from."""
    ids = torch.tensor([[0, 1, 2, 3, 11, 12, 0], [1, 2, 3, 4, 11, 12, 13], [0, 0, 0, 1, 11, 0, 0],
                        [0, 0, 1, 2, 11, 12, 13], [0, 1, 2, 3, 11, 0, 0]])  # fmt: skip
    b, t = ids.shape
    streams = 1000 * torch.arange(k)[None, :, None] + 100 * torch.arange(b)[:, None, None]
    pos = streams + torch.arange(t)[None, None, :]
    mask = (ids > 0).long()
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos,
            "response_mask": mask[:, 4:]}  # fmt: skip


@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("oversize", ["alone", "split"])
def test_mrope_positions_are_packed_sample_by_sample(k: int, layout: str, oversize: str) -> None:
    data = mrope_batch(k)
    roll = Rollout(data)
    plan = plan_batch(roll.lengths, dp=1, max_tokens=6, layout=layout, oversize=oversize)
    assert (plan.piece_starts is not None) == (oversize == "split")  # the 7 tokens of row 1
    mask = data["attention_mask"].bool()
    seen = 0
    for mb in roll.micro_batches(plan, 0, 0):
        rows = mb.input_ids.shape[0]
        assert mb.position_ids.shape == (k, rows, mb.input_ids.shape[1])
        assert "position_ids" not in mb.fields
        offsets = mb.sample_offsets.tolist() if mb.sample_offsets is not None else None
        for q, (i, n) in enumerate(zip(mb.sample_ids.tolist(), mb.seq_lens.tolist(),
                                       strict=True)):  # fmt: skip
            first = offsets[q] if offsets else 0
            want = data["position_ids"][i][:, mask[i]][:, first : first + n]  # [k, n]
            if isinstance(mb, PackedRollout):
                at = slice(int(mb.cu_seqlens[q]), int(mb.cu_seqlens[q + 1]))
                got = mb.position_ids[:, 0, at]
            else:
                got = mb.position_ids[:, q, :n]
            assert torch.equal(got, want), (i, got, want)
            seen += n
    assert seen == int(roll.lengths.sum())


@pytest.mark.parametrize("shape", [(5, 3, 6), (5, 7, 3), (5, 3, 7, 1), (5, 7, 7, 1)])
def test_positions_of_another_shape_are_one_line(shape: tuple[int, ...]) -> None:
    data = {**mrope_batch(), "position_ids": torch.zeros(shape, dtype=torch.long)}
    with pytest.raises(InputError, match=r"^position_ids: \(5, .*\), not \[5, 7\] \(one position "
                       r"a token\) or \[5, k, 7\] \(mRoPE: k positions a token\)$"):  # fmt: skip
        Rollout(data)
    data["position_ids"] = torch.zeros(5, 3, dtype=torch.long)  # not the response part either
    with pytest.raises(InputError, match=r"^position_ids: \(5, 3\), not \[5, 7\]"):
        Rollout(data)
