"""Numerical equivalence on a tiny transformer (fp32, CPU).

- packed (block-diagonal mask), padded (B x T x T mask) and blocks layouts give the same
  per-sample losses and the same gradients;
- a packed row with the mask gives the logits of every sample run alone (DESIGN.md's note), and
  without the mask it does not;
- gradient accumulation over a step's micro-batches (and dp ranks), normalised by the step's
  token count, equals one batch of all the step's samples.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from plan_helpers import make_plan  # noqa: E402

from varpack.torch import PlanLoader, normalise, token_loss_sum, token_losses  # noqa: E402
from varpack.torch.model import PRESETS, TinyGPT, model_inputs  # noqa: E402

LENS = {11: 7, 12: 3, 13: 12, 14: 1, 15: 9, 16: 5}
ATOL = 1e-5


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(PRESETS["tiny"]).eval()


@pytest.fixture(scope="module")
def data() -> dict[int, np.ndarray]:
    rng = np.random.default_rng(3)
    return {i: rng.integers(1, 256, n) for i, n in LENS.items()}


def _spans(batch) -> list[tuple[int, int, int]]:
    """(row, start, length) of every sample, from the batch's own bookkeeping."""
    lens = batch.seq_lens.tolist()
    if hasattr(batch, "starts"):  # blocks
        return list(zip(batch.block_index.tolist(), batch.starts.tolist(), lens, strict=True))
    if hasattr(batch, "cu_seqlens"):  # packed
        return [(0, s, n) for s, n in zip(batch.cu_seqlens.tolist(), lens, strict=False)]
    return [(r, 0, n) for r, n in enumerate(lens)]  # padded


def _per_sample_loss(model, batch) -> tuple[dict[int, float], torch.Tensor]:
    """Sum of token losses per sample id, and the total (for gradients)."""
    tl = token_losses(model(**model_inputs(batch)), batch.labels)  # [R, T-1]: t predicts t+1
    spans = _spans(batch)
    d = tl.detach()
    out = {
        sid: float(d[r, s : s + n - 1].sum())
        for sid, (r, s, n) in zip(batch.sample_ids.tolist(), spans, strict=True)
    }
    assert abs(sum(out.values()) - float(d.sum())) < 1e-4  # nothing outside the samples counts
    return out, tl.sum()


def _grads(model, loss) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_packed_padded_blocks_same_losses_and_gradients(tmp_path, model, data) -> None:
    micro = [list(LENS)]
    packed = next(
        iter(
            PlanLoader(make_plan(tmp_path / "a", LENS, micros=micro, pad_multiple=16), data, rank=0)
        )
    )
    padded = next(
        iter(
            PlanLoader(make_plan(tmp_path / "b", LENS, layout="padded", micros=micro), data, rank=0)
        )
    )
    blocks_plan = make_plan(
        tmp_path / "c", LENS, blocks=[[[11, 12], [13], [14, 15], [16]]], block_len=12
    )
    blocks = next(iter(PlanLoader(blocks_plan, data, rank=0)))
    assert (
        packed.input_ids.shape == (1, 48)
        and padded.input_ids.shape == (6, 12)
        and blocks.shape == (4, 12)
    )
    lp, tp = _per_sample_loss(model, packed)
    ld, td = _per_sample_loss(model, padded)
    lb, tb = _per_sample_loss(model, blocks)
    assert set(lp) == set(ld) == set(lb) == set(LENS)
    for sid in LENS:
        assert abs(lp[sid] - ld[sid]) < ATOL and abs(lp[sid] - lb[sid]) < ATOL
    assert min(lp.values()) >= 0 and float(tp.detach()) > 1.0  # the comparison is not between zeros
    gp, gd, gb = _grads(model, tp), _grads(model, td), _grads(model, tb)
    for a, b, c in zip(gp, gd, gb, strict=True):
        assert torch.allclose(a, b, atol=ATOL) and torch.allclose(a, c, atol=ATOL)


def test_packed_with_mask_matches_each_sample_alone(tmp_path, model, data) -> None:
    plan = make_plan(tmp_path / "p", LENS, micros=[list(LENS)], pad_multiple=16)
    batch = next(iter(PlanLoader(plan, data, rank=0)))
    with torch.no_grad():
        packed = model(**model_inputs(batch))[0]
        no_mask = model(input_ids=batch.input_ids, position_ids=batch.position_ids)[
            0
        ]  # causal only
        cu = batch.cu_seqlens.tolist()
        worst_masked = worst_unmasked = 0.0
        for k, sid in enumerate(batch.sample_ids.tolist()):
            tokens = torch.as_tensor(data[sid]).view(1, -1)
            alone = model(input_ids=tokens, position_ids=torch.arange(tokens.shape[1]).view(1, -1))[
                0
            ]
            worst_masked = max(worst_masked, float((packed[cu[k] : cu[k + 1]] - alone).abs().max()))
            worst_unmasked = max(
                worst_unmasked, float((no_mask[cu[k] : cu[k + 1]] - alone).abs().max())
            )
    assert worst_masked < ATOL
    assert worst_unmasked > 1e-3  # restarting positions alone do not isolate the samples


def test_grad_accumulation_with_step_tokens_equals_one_batch(tmp_path, model, data) -> None:
    # One step, dp=2 ranks x 2 micro-batches of unequal token counts.
    micros = [[11, 12], [13], [14, 15], [16]]
    plan = make_plan(tmp_path / "p", LENS, dp=2, grad_accum=2, micros=micros)
    rank_grads = []
    for rank in range(2):
        model.zero_grad(set_to_none=True)
        for batch in PlanLoader(plan, data, rank=rank):
            loss = normalise(
                token_loss_sum(model(**model_inputs(batch)), batch.labels), batch, world_size=2
            )
            loss.backward()
        rank_grads.append([p.grad.clone() for p in model.parameters()])
    ddp = [
        (a + b) / 2 for a, b in zip(*rank_grads, strict=True)
    ]  # what DDP's all-reduce averages to
    # Reference: all samples in one padded batch, mean over every supervised token.
    whole = make_plan(tmp_path / "w", LENS, layout="padded", micros=[list(LENS)])
    batch = next(iter(PlanLoader(whole, data, rank=0)))
    logits = model(**model_inputs(batch))
    n_label = sum(n - 1 for n in LENS.values())
    assert batch.label_tokens == n_label
    ref = _grads(model, token_loss_sum(logits, batch.labels) / n_label)
    for a, b in zip(ddp, ref, strict=True):
        assert torch.allclose(a, b, atol=ATOL)
    # Averaging per-micro-batch means instead would not match (so the test can tell).
    model.zero_grad(set_to_none=True)
    for rank in range(2):
        for b in PlanLoader(plan, data, rank=rank):
            tl = token_losses(model(**model_inputs(b)), b.labels)
            (tl.sum() / max(int((b.labels != -100).sum()), 1) / 4).backward()
    naive = [p.grad.clone() for p in model.parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(naive, ref, strict=True)) > 1e-4
