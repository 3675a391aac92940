"""Static compile: after compile_warmup, a pass over the plan compiles nothing new."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from plan_helpers import make_plan  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

from varpack.planfile.schema import CHECKSUM_KEY, plan_checksum  # noqa: E402
from varpack.torch import (
    PlanLoader,
    compile_warmup,
    dummy_batch,
    normalise,
    rank_shapes,
    token_loss_sum,
)  # noqa: E402
from varpack.torch.model import PRESETS, TinyGPT, model_inputs  # noqa: E402

pytestmark = pytest.mark.slow  # each test compiles a model (seconds of CPU)


def _loss(model, batch) -> torch.Tensor:
    return normalise(token_loss_sum(model(**model_inputs(batch)), batch.labels), batch, 1)


@pytest.fixture
def plan_and_data(tmp_path):
    # Lengths chosen so the packed plan has 3 distinct pad_to values (multiples of 16).
    rng = np.random.default_rng(5)
    lens = {i: int(n) for i, n in enumerate(rng.integers(3, 30, 40))}
    data = {i: rng.integers(1, 256, n) for i, n in lens.items()}
    plan = make_plan(tmp_path / "p", lens, budget=48, pad_multiple=16)
    return plan, data


def test_shapes_from_manifest_and_plan_json(plan_and_data) -> None:
    plan, data = plan_and_data
    loader = PlanLoader(plan, data, rank=0)
    derived = rank_shapes(loader, 0)
    assert derived == list(dict.fromkeys(b.shape for b in loader))  # first-appearance order
    assert 2 <= len(derived) <= 4
    # A per-rank record in plan.json is used when it agrees with the manifest.
    doc = json.loads((plan / "plan.json").read_text())
    doc["shapes"] = [[list(s) for s in reversed(derived)]]
    doc[CHECKSUM_KEY] = plan_checksum(doc)  # sealed as varpack plan would
    (plan / "plan.json").write_text(json.dumps(doc))
    assert rank_shapes(plan, 0) == list(reversed(derived))


def test_warmup_then_no_recompilation(plan_and_data) -> None:
    plan, data = plan_and_data
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyGPT(PRESETS["tiny"])
    counter = CompileCounterWithBackend("aot_eager")  # forward + backward graphs, no C++ build
    compiled = torch.compile(model, backend=counter, dynamic=False)
    loader = PlanLoader(plan, data, rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    rng_before = torch.get_rng_state()
    shapes = compile_warmup(compiled, loader, 0, lambda s: dummy_batch(s, "packed"), _loss)
    assert counter.frame_count == len(shapes) == len(set(shapes))
    assert all(p.grad is None for p in model.parameters())  # gradients zeroed
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not opt.state and torch.equal(rng_before, torch.get_rng_state())
    warm = counter.frame_count
    for batch in loader:
        _loss(compiled, batch).backward()
        if batch.is_last_micro:
            opt.step()
            opt.zero_grad()
    assert counter.frame_count == warm  # no shape was new


def test_without_warmup_the_pass_compiles_per_shape(plan_and_data) -> None:
    plan, data = plan_and_data
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(TinyGPT(PRESETS["tiny"]), backend=counter, dynamic=False)
    loader = PlanLoader(plan, data, rank=0)
    for batch in loader:
        with torch.no_grad():
            compiled(**model_inputs(batch))
    assert counter.frame_count == len(rank_shapes(loader, 0)) > 1  # the counter does see shapes


# -- attention paths under a static compile ------------------------------------------------------


def _static_pass(
    plan, data, layout, attention, max_seqlen="row", grad=True, max_batches=None
) -> tuple[int, int]:
    """Warm up every shape with dummy batches, then replay the plan: (graphs at warm-up, after)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyGPT(PRESETS["tiny"])
    counter = CompileCounterWithBackend("aot_eager" if grad else "eager")
    compiled = torch.compile(model, backend=counter, dynamic=False)

    def loss(m, batch):
        inputs = model_inputs(batch, attention, max_seqlen=max_seqlen)
        return normalise(token_loss_sum(m(**inputs), batch.labels), batch, 1)

    loader = PlanLoader(plan, data, rank=0, collate=layout)
    with torch.set_grad_enabled(grad):
        if grad:
            compile_warmup(compiled, loader, 0, lambda s: dummy_batch(s, layout), loss)
        else:  # FlexAttention has no CPU backward: forward passes only
            for shape in rank_shapes(loader, 0):
                loss(compiled, dummy_batch(shape, layout))
        warm = counter.frame_count
        for k, batch in enumerate(loader):
            if k == max_batches:
                break
            out = loss(compiled, batch)
            if grad:
                out.backward()
    return warm, counter.frame_count


@pytest.fixture
def padded_plan(tmp_path):
    rng = np.random.default_rng(5)
    lens = {i: int(n) for i, n in enumerate(rng.integers(3, 30, 24))}
    lens.update({i: 3 + i % 13 for i in range(8)})  # the first two rows fit 16 tokens
    data = {i: rng.integers(1, 256, n) for i, n in lens.items()}
    micros = [list(range(k, k + 4)) for k in range(0, 24, 4)]  # B = 4 rows, T of 16 or 32
    return make_plan(tmp_path / "pad", lens, layout="padded", micros=micros, pad_multiple=16), data


@pytest.fixture
def traceable_varlen_kernel(monkeypatch):
    """torch's varlen kernel replaced by a traceable CPU stand-in (same signature and contract)."""
    from attention_helpers import pretend_cuda, traceable_varlen

    from varpack.torch import attention

    monkeypatch.setattr(attention, "varlen_attn", traceable_varlen)
    pretend_cuda(monkeypatch)


def test_static_compile_padded_is_causal(padded_plan) -> None:
    plan, data = padded_plan
    warm, after = _static_pass(plan, data, "padded", "causal")
    assert warm >= 2 and after == warm  # B x T shapes differ; nothing compiles after warm-up


def test_static_compile_varlen_row_bound_and_dynamic_cu_seqlens(
    plan_and_data, traceable_varlen_kernel
) -> None:
    plan, data = plan_and_data
    loader = PlanLoader(plan, data, rank=0)
    segments = {(b.shape, len(b.cu_seqlens)) for b in loader}
    assert len(segments) > len({s for s, _ in segments})  # a shape meets several sample counts
    warm, after = _static_pass(plan, data, "packed", "varlen")
    assert warm == len(rank_shapes(loader, 0)) and after == warm
    # Control: the longest sample as max_seqlen changes per batch, and dynamo specialises on it.
    warm, after = _static_pass(
        plan, data, "packed", "varlen", max_seqlen="batch", grad=False, max_batches=3
    )
    assert after > warm


def test_static_compile_flex_forward(plan_and_data) -> None:
    plan, data = plan_and_data
    warm, after = _static_pass(plan, data, "packed", "flex", grad=False)
    assert warm >= 2 and after == warm
