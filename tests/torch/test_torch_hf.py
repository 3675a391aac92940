"""Hugging Face models: a varpack batch through a tiny Llama keeps every sample to itself, and
``labels`` + ``num_items_in_batch`` give exactly the token-mean loss of the samples run alone.

For each ``attn_implementation`` that runs on the CPU (sdpa, eager, flex_attention) and each
layout, the logits of every sample equal those of the sample run alone. The flash path
(``cu_seq_lens_q/k``, ``max_length_q/k``) runs through a custom attention function registered with
transformers that computes exact attention per segment from those kwargs, since flash-attn needs
CUDA; with flash-attn installed, ``flash_attention_2`` itself is checked too.
"""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

pytest.importorskip("torch.nn")
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from attention_helpers import LENS, layout_batches, sample_tokens, segment_loop, spans  # noqa: E402
from plan_helpers import make_plan  # noqa: E402
from torch.nn.attention.flex_attention import flex_attention  # noqa: E402

from varpack.errors import ConfigError  # noqa: E402
from varpack.torch import PlanLoader, normalise, token_loss_sum  # noqa: E402
from varpack.torch.hf import hf_attention_kind, hf_inputs  # noqa: E402

ATOL = 1e-4
VOCAB = 128
FAKE_FLASH = "varpack_test_varlen"
CALLS: list[dict] = []
IMPLS = ["sdpa", "eager", "flex_attention", FAKE_FLASH]
if importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available():
    IMPLS.append("flash_attention_2")


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """A transformers attention function with flash's padding-free contract (per-segment SDPA)."""
    b, h, t, d = query.shape
    assert attention_mask is None, "the varlen path must not get a mask"
    cu = kw.get("cu_seq_lens_q")
    if cu is None:  # no packing: one sample per row
        cu = torch.arange(0, b * t + 1, t, dtype=torch.int32)
    CALLS.append({k: kw.get(k) for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q")})
    flat = [x.transpose(1, 2).reshape(b * t, x.shape[1], d) for x in (query, key, value)]
    out = segment_loop(*flat, cu, causal=True, scale=scaling)
    return out.view(b, t, h, d), None


transformers.AttentionInterface.register(FAKE_FLASH, varlen_attention)


@pytest.fixture(scope="module")
def data() -> dict[int, np.ndarray]:
    return sample_tokens(vocab=VOCAB)


@pytest.fixture(scope="module")
def batches(tmp_path_factory, data):
    return layout_batches(tmp_path_factory.mktemp("hf"), data)


@pytest.fixture(scope="module")
def llama():
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture
def eager_flex(monkeypatch):
    """transformers compiles flex_attention per shape (~30 s on this CPU): run it eagerly here."""
    import transformers.integrations.flex_attention as hf_flex

    def eager(q, k, v, training=False, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return flex_attention(q, k, v, **kwargs)

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", eager)


def _alone(llama, data) -> dict[int, torch.Tensor]:
    llama.set_attn_implementation("sdpa")
    with torch.no_grad():
        return {sid: llama(input_ids=torch.as_tensor(x)[None]).logits[0] for sid, x in data.items()}


def _worst(logits: torch.Tensor, batch, alone: dict[int, torch.Tensor]) -> float:
    worst = 0.0
    for sid, (r, s, n) in zip(batch.sample_ids.tolist(), spans(batch), strict=True):
        worst = max(worst, float((logits[r, s : s + n] - alone[sid]).abs().max()))
    return worst


def _run(llama, impl: str, kwargs: dict) -> torch.Tensor:
    llama.set_attn_implementation(impl)
    with torch.no_grad():
        return llama(**kwargs).logits


@pytest.mark.parametrize("layout", ["packed", "padded", "blocks"])
@pytest.mark.parametrize("impl", IMPLS)
def test_packed_samples_stay_isolated(llama, data, batches, eager_flex, impl, layout) -> None:
    alone = _alone(llama, data)
    batch = batches[layout]
    kind = "varlen" if impl == FAKE_FLASH else None
    CALLS.clear()
    # With a cache, transformers does not infer sample boundaries from position_ids itself:
    # the isolation checked here comes from hf_inputs' mask / cu_seq_lens alone.
    kwargs = {**hf_inputs(batch, impl, kind=kind), "use_cache": True}
    logits = _run(llama, impl, kwargs)
    assert torch.isfinite(logits).all()  # an empty padded row or block gives no NaN
    assert _worst(logits, batch, alone) <= ATOL
    if impl == FAKE_FLASH and layout != "padded":
        assert len(CALLS) == 2  # one call per layer, each with the batch's cu_seqlens
        assert torch.equal(CALLS[0]["cu_seq_lens_q"], batch.cu_seqlens)
        assert CALLS[0]["max_length_q"] == batch.max_seqlen


def test_kwargs_per_implementation(batches) -> None:
    packed, padded = batches["packed"], batches["padded"]
    n = packed.input_ids.shape[1]
    sdpa = hf_inputs(packed, "sdpa")
    mask = sdpa["attention_mask"]
    assert mask.dtype == torch.bool and mask.shape == (1, 1, n, n)
    assert sdpa["use_cache"] is False and torch.equal(sdpa["position_ids"], packed.position_ids)
    eager = hf_inputs(packed, "eager", dtype=torch.bfloat16)["attention_mask"]
    assert eager.dtype == torch.bfloat16 and set(eager.unique().tolist()) == {
        0.0,
        torch.finfo(torch.bfloat16).min,
    }
    flex = hf_inputs(packed, "flex_attention")["attention_mask"]
    assert type(flex).__name__ == "BlockMask" and flex.shape == (1, 1, n, n)
    flash = hf_inputs(packed, "flash_attention_2", max_seqlen="row")
    assert "attention_mask" not in flash and flash["max_length_k"] == n
    assert flash["cu_seq_lens_q"].dtype == torch.int32
    assert "attention_mask" not in hf_inputs(padded, "sdpa")  # right padding + causal: no mask
    assert hf_attention_kind("flash_attention_3") == "varlen"
    with pytest.raises(ConfigError, match="no packed-sample recipe"):
        hf_attention_kind("paged_attention")


def test_controls_position_ids_alone_and_a_boolean_eager_mask_leak(llama, data, batches) -> None:
    alone = _alone(llama, data)
    batch = batches["packed"]
    # With the default cache, restarting positions leave cross-sample attention (DESIGN.md).
    plain = {"input_ids": batch.input_ids, "position_ids": batch.position_ids}
    assert _worst(_run(llama, "sdpa", plain), batch, alone) > 1e-2
    # Eager attention adds the mask to the scores: a boolean mask does not mask anything.
    boolean = hf_inputs(batch, "eager", kind="bool_mask")
    assert _worst(_run(llama, "eager", boolean), batch, alone) > 1e-2


# -- the exact loss: labels + num_items_in_batch ---------------------------------------------
LOSS_TOL = 1e-5  # fp32 on the CPU: the packed and the alone runs differ by ~1e-6


def _alone_loss(llama, data) -> float:
    """The token-mean loss of the samples, each run alone (the definition of exact)."""
    llama.set_attn_implementation("sdpa")
    total = labels = 0.0
    with torch.no_grad():
        for x in data.values():
            ids = torch.as_tensor(x)[None]
            total += float(llama(input_ids=ids, labels=ids, num_items_in_batch=1).loss)
            labels += len(x) - 1
    return total / labels


@pytest.mark.parametrize("layout", ["packed", "padded", "blocks"])
@pytest.mark.parametrize("impl", IMPLS)
def test_labels_and_num_items_give_the_exact_loss(llama, data, batches, eager_flex, impl, layout):
    batch = batches[layout]
    kind = "varlen" if impl == FAKE_FLASH else None
    kwargs = hf_inputs(batch, impl, kind=kind, labels=True)
    assert kwargs["labels"] is batch.labels
    llama.set_attn_implementation(impl)
    with torch.no_grad():
        out = llama(**kwargs, num_items_in_batch=batch.label_tokens)
    assert abs(float(out.loss) - _alone_loss(llama, data)) <= LOSS_TOL
    # the same number as varpack's own loss for a custom model (one rank)
    own = normalise(token_loss_sum(out.logits, batch.labels), batch, world_size=1)
    assert abs(float(out.loss) - float(own)) <= 1e-6


def test_micro_batch_losses_add_up_to_the_step_mean(llama, data, tmp_path) -> None:
    """Two micro-batches of one step: with num_items_in_batch = the step's label tokens the
    losses add up to the exact mean; transformers' default (each micro-batch's own mean) does not."""
    plan = make_plan(tmp_path / "acc", LENS, grad_accum=2, micros=[[13, 15], [11, 12, 14, 16]])
    micro = list(PlanLoader(plan, data, rank=0))
    assert [b.step for b in micro] == [0, 0] and micro[0].label_tokens == sum(LENS.values()) - 6
    llama.set_attn_implementation("sdpa")
    with torch.no_grad():
        exact = sum(
            float(llama(**hf_inputs(b, labels=True), num_items_in_batch=b.label_tokens).loss)
            for b in micro
        )
        means = [float(llama(**hf_inputs(b, labels=True)).loss) for b in micro]
    ref = _alone_loss(llama, data)
    assert abs(exact - ref) <= LOSS_TOL
    assert abs(sum(means) / len(means) - ref) > 100 * LOSS_TOL  # the mean of means is biased


def test_position_ids_alone_give_a_wrong_loss(llama, data, batches) -> None:
    """position_ids without a mask on packed rows (the default use_cache): samples see each other."""
    batch = batches["packed"]
    llama.set_attn_implementation("sdpa")
    plain = {"input_ids": batch.input_ids, "position_ids": batch.position_ids}
    with torch.no_grad():
        wrong = llama(**plain, labels=batch.labels, num_items_in_batch=batch.label_tokens).loss
    assert abs(float(wrong) - _alone_loss(llama, data)) > 500 * LOSS_TOL
