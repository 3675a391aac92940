"""Tensors in and out: a verl-shaped rollout cut into a plan's micro-batches, log-probs put back
in order, and the split mini-batch's loss and gradients equal to the unsplit one's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from rollout_helpers import clipped_token_losses, verl_batch  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.online import plan_batch  # noqa: E402
from varpack.torch.model import GPTConfig, TinyGPT, model_inputs  # noqa: E402
from varpack.torch.rollout import (  # noqa: E402
    PackedRollout,
    Rollout,
    token_log_probs,
)

pytestmark = pytest.mark.torch
# SDPA sample by sample (packed) or plain causal rows (padded): "auto" would look for varlen
# kernels first, which loads torch._dynamo (seconds) on a CPU that has none
ATTN = {"PackedRollout": "segments", "PaddedRollout": "causal"}


@pytest.fixture(autouse=True)
def one_thread():  # tiny tensors: torch's intra-op threads only wait on each other (14x slower)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _batch(n: int = 24, seed: int = 0) -> tuple[dict[str, object], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    prompts, responses = rng.integers(2, 12, n), rng.integers(1, 20, n)
    return verl_batch(prompts, responses, seed=seed), prompts, responses


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_micro_batches_hold_each_sample_and_its_fields(layout) -> None:
    data, prompts, responses = _batch()
    roll = Rollout(data)
    assert roll.lengths.tolist() == (prompts + responses).tolist()
    assert roll.loss_tokens().tolist() == responses.tolist()
    plan = plan_batch(roll.lengths, dp=2, max_tokens=40, mini_batches=2, layout=layout,
                      pad_multiple=4)  # fmt: skip
    ids, mask = data["input_ids"], data["attention_mask"].bool()
    seen = []
    for step in range(plan.num_steps):
        for rank in range(2):
            mbs = roll.micro_batches(plan, rank, step)
            assert len(mbs) == plan.micro_per_step
            for j, mb in enumerate(mbs):
                assert mb.step == step and mb.micro == j and mb.is_last_micro == (j == len(mbs) - 1)
                assert mb.step_loss_tokens == plan.step_loss_tokens[step]
                assert mb.carry["uid"] == [data["uid"][i] for i in mb.sample_ids.tolist()]
                assert torch.equal(mb.carry["scores"], data["scores"][mb.sample_ids])
                for q, i in enumerate(mb.sample_ids.tolist()):
                    seen.append(i)
                    n, a = int(prompts[i] + responses[i]), int(prompts[i])
                    if isinstance(mb, PackedRollout):
                        at = slice(int(mb.cu_seqlens[q]), int(mb.cu_seqlens[q + 1]))
                        got = {k: v[0, at] for k, v in mb.fields.items()}
                        tokens, pos = mb.input_ids[0, at], mb.position_ids[0, at]
                    else:
                        got = {k: v[q, :n] for k, v in mb.fields.items()}
                        tokens, pos = mb.input_ids[q, :n], mb.position_ids[q, :n]
                        assert mb.attention_mask[q].sum() == n
                    assert torch.equal(tokens, ids[i][mask[i]])
                    assert pos.tolist() == list(range(n))  # verl's positions: 0 at the first token
                    # response-wide fields sit on the response tokens, 0 on the prompt's
                    assert got["response_mask"].tolist() == [0] * a + [1] * (n - a)
                    assert torch.equal(got["responses"][a:], data["responses"][i, : n - a])
                    assert torch.equal(got["old_log_probs"][a:], data["old_log_probs"][i, : n - a])
    assert sorted(seen) == list(range(len(prompts)))


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_outputs_go_back_in_order_exactly(layout) -> None:
    data, prompts, responses = _batch(40, seed=2)
    roll = Rollout(data)
    plan = plan_batch(roll.lengths, dp=3, max_tokens=48, forward_only=True, layout=layout)
    parts = []
    for rank in range(3):  # each rank's outputs: here the tensor each token came with
        mbs = roll.micro_batches(plan, rank, 0)
        outs = [mb.fields["old_log_probs"] for mb in mbs]
        parts.append(roll.restore(mbs, outs, width=data["old_log_probs"].shape[1]))
    assert torch.equal(sum(parts), data["old_log_probs"])  # every entry from exactly one rank


def test_forward_only_log_probs_match_each_sample_alone() -> None:
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig()).eval()
    data, prompts, responses = _batch(30, seed=4)
    roll = Rollout(data)
    width = data["responses"].shape[1]
    plan = plan_batch(roll.lengths, dp=2, max_tokens=64, forward_only=True)
    parts = []
    with torch.no_grad():
        for rank in range(2):
            mbs = roll.micro_batches(plan, rank, 0)
            lps = [
                token_log_probs(
                    model(**model_inputs(mb, attention=ATTN[mb.__class__.__name__])), mb
                )
                for mb in mbs
            ]
            parts.append(roll.restore(mbs, lps, width=width))
        got = parts[0] + parts[1]
        mask = data["attention_mask"].bool()
        for i in range(len(prompts)):
            ids = data["input_ids"][i][mask[i]][None]
            pos = torch.arange(ids.shape[1])[None]
            lp = torch.log_softmax(model(ids, pos)[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            r = int(responses[i])
            assert torch.allclose(got[i, :r], lp[-r:], atol=1e-5)
            assert (got[i, r:] == 0).all()


def test_split_mini_batch_loss_and_gradients_equal_the_unsplit_ones() -> None:
    torch.manual_seed(1)
    model = TinyGPT(GPTConfig())
    data, prompts, responses = _batch(32, seed=5)
    roll = Rollout(data)
    dp = 2
    plan = plan_batch(roll.lengths, dp=dp, max_tokens=40, mini_batches=2,
                      loss_tokens=roll.loss_tokens(), groups=4)  # fmt: skip
    mask = data["attention_mask"].bool()
    for step in range(plan.num_steps):
        # unsplit: every sample of the step alone, the loss a mean over its response tokens
        model.zero_grad()
        ref = torch.zeros(())
        for i in np.flatnonzero(plan.sample_step == step):
            ids = data["input_ids"][i][mask[i]][None]
            logits = model(ids, torch.arange(ids.shape[1])[None])
            lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            r = int(responses[i])
            losses = clipped_token_losses(
                lp[-r:],
                data["old_log_probs"][i, :r],
                data["advantages"][i, :r],
                data["response_mask"][i, :r],
            )
            ref = ref + losses.sum()  # fmt: skip
        ref = ref / plan.step_loss_tokens[step]
        ref.backward()
        want = {k: p.grad.clone() for k, p in model.named_parameters()}
        # split: each rank its micro-batches, scaled by dp / step loss tokens, grads averaged
        got = {k: torch.zeros_like(v) for k, v in want.items()}
        total = torch.zeros(())
        for rank in range(dp):
            model.zero_grad()
            for mb in roll.micro_batches(plan, rank, step):
                lp = token_log_probs(
                    model(**model_inputs(mb, attention=ATTN[mb.__class__.__name__])), mb
                )
                f = mb.fields
                losses = clipped_token_losses(lp, f["old_log_probs"], f["advantages"],
                                              f["response_mask"])  # fmt: skip
                loss = losses.sum() * dp / mb.step_loss_tokens
                loss.backward()
                total = total + loss.detach() / dp
            for k, p in model.named_parameters():
                got[k] += p.grad / dp
        assert torch.allclose(total, ref.detach(), atol=1e-5, rtol=0)
        for k in want:
            assert torch.allclose(got[k], want[k], atol=1e-5, rtol=1e-5), k


def test_a_variable_length_list_and_bad_batches() -> None:
    seqs = [torch.arange(1, n + 1) for n in (5, 3, 8, 2)]
    roll = Rollout(seqs)
    plan = plan_batch(roll.lengths, dp=2, max_tokens=10)
    mbs = [mb for rank in range(2) for mb in roll.micro_batches(plan, rank, 0)]
    outs = [mb.input_ids.float() for mb in mbs]
    back = roll.restore(mbs, outs)  # right-padded [B, longest]
    for i, t in enumerate(seqs):
        assert back[i, : len(t)].tolist() == t.float().tolist() and (back[i, len(t) :] == 0).all()
    with pytest.raises(InputError, match="input_ids and attention_mask"):
        Rollout({"input_ids": torch.zeros(2, 3, dtype=torch.long)})
    bad = {
        "input_ids": torch.ones(2, 3, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 0], [0, 0, 0]]),
    }
    with pytest.raises(InputError, match="row 1 of attention_mask has no real token"):
        Rollout(bad)
    proto = SimpleNamespace(batch=_batch(4)[0], non_tensor_batch={"uid": np.arange(4)})
    assert Rollout(proto).lengths.tolist() == Rollout(proto.batch).lengths.tolist()  # verl's
    with pytest.raises(InputError, match="not int"):
        Rollout(3)
    bad = {**_batch(4)[0], "scores": torch.zeros(3)}
    with pytest.raises(InputError, match="scores: 3 entries for a batch of 4"):
        Rollout(bad)
