"""Attention backends: selection, per-batch inputs, kernel wiring, and per-sample isolation.

The CUDA-only kernels (flash-attn, torch's varlen) cannot run here: fakes stand in for them
(:mod:`attention_helpers`) and record what they were given. FlexAttention runs eagerly on the CPU,
forward only (torch has no CPU backward for it).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from attention_helpers import (  # noqa: E402
    fake_flash,
    fake_varlen,
    layout_batches,
    pretend_cuda,
    sample_tokens,
    spans,
)

from varpack.errors import ConfigError  # noqa: E402
from varpack.torch import attention as A  # noqa: E402
from varpack.torch import masks  # noqa: E402
from varpack.torch.loss import token_losses  # noqa: E402
from varpack.torch.model import PRESETS, TinyGPT, model_inputs  # noqa: E402

ATOL = 1e-5
CUDA, BF16 = torch.device("cuda"), torch.bfloat16


@pytest.fixture(scope="module")
def data() -> dict[int, np.ndarray]:
    return sample_tokens()


@pytest.fixture(scope="module")
def batches(tmp_path_factory, data):
    return layout_batches(tmp_path_factory.mktemp("attn"), data)


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(PRESETS["tiny"]).eval()


@pytest.fixture
def fakes(monkeypatch):
    """Fake flash and varlen kernels on a pretend CUDA device; returns their call records."""
    calls: dict[str, list] = {"flash": [], "varlen": []}
    monkeypatch.setattr(A, "flash_attn_varlen_func", fake_flash(calls["flash"]))
    monkeypatch.setattr(A, "varlen_attn", fake_varlen(calls["varlen"]))
    pretend_cuda(monkeypatch)
    return calls


def test_auto_picks_the_fastest_available(monkeypatch) -> None:
    cpu = torch.device("cpu")
    assert [A.resolve_backend("auto", cpu, torch.float32, lay) for lay in ("packed", "blocks")] == [
        "segments",
        "segments",
    ]
    assert A.resolve_backend("auto", cpu, torch.float32, "padded", causal=False) == "mask"
    assert A.resolve_backend("auto", cpu, torch.float32, "padded") == "causal"
    monkeypatch.setattr(A, "flash_attn_varlen_func", lambda *a, **k: None)
    monkeypatch.setattr(A, "varlen_attn", fake_varlen([]))
    monkeypatch.setattr(A, "cuda_capability", lambda device: (9, 0))
    assert A.resolve_backend("auto", CUDA, BF16, "packed") == "flash"
    assert A.resolve_backend("auto", CUDA, BF16, "padded") == "causal"
    assert A.resolve_backend("auto", CUDA, torch.float32, "packed") == "flex"  # kernels need half
    monkeypatch.setattr(A, "flash_attn_varlen_func", None)
    assert A.resolve_backend("auto", CUDA, BF16, "blocks") == "varlen"
    monkeypatch.setattr(A, "cuda_capability", lambda device: (7, 5))  # no flash kernels on sm75
    assert A.resolve_backend("auto", CUDA, BF16, "packed") == "flex"
    monkeypatch.setattr(A, "flex_attention", None)
    assert A.resolve_backend("auto", CUDA, BF16, "packed") == "segments"
    assert A.resolve_backend("auto", CUDA, BF16, "padded", causal=False) == "mask"


def test_auto_on_the_cpu_imports_no_kernel() -> None:
    """Off CUDA ``auto`` decides without importing a kernel: varlen's and flex's modules load
    torch._dynamo, seconds of start-up in a process that never runs them (a refused trainer)."""
    code = ("import sys, torch; from varpack.torch.attention import resolve_backend as r; "
            "before = 'torch._dynamo' in sys.modules; "
            "print(before, r('auto', 'cpu', torch.float32, 'packed'), "
            "r('auto', 'cpu', torch.bfloat16, 'blocks'), 'torch._dynamo' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "segments", "segments", "False"]


@pytest.mark.parametrize(
    ("name", "layout", "why"),
    [
        ("flash", "packed", "flash-attn is not installed"),
        ("varlen", "packed", "needs a CUDA device"),
        ("causal", "packed", "lets packed samples attend to each other"),
        ("causal", "blocks", "for padded batches"),
        ("nope", "packed", "unknown attention backend 'nope'"),
    ],
)
def test_an_explicit_choice_that_cannot_run_says_why(monkeypatch, name, layout, why) -> None:
    monkeypatch.setattr(A, "flash_attn_varlen_func", None)
    with pytest.raises(A.BackendUnavailableError, match=why) as err:
        A.resolve_backend(name, "cpu", torch.float32, layout)
    assert isinstance(err.value, ConfigError)  # the trainer prints it on one line


def test_varlen_needs_half_precision_and_the_installed_signature_is_read(monkeypatch) -> None:
    monkeypatch.setattr(A, "cuda_capability", lambda device: (9, 0))
    if A.varlen_attn is not None:  # torch >= 2.10: the real signature, read by inspection
        assert A.varlen_causal_kwargs(A.varlen_attn) in (
            {"window_size": (-1, 0)},
            {"is_causal": True},
        )
        with pytest.raises(A.BackendUnavailableError, match="fp16 or bf16"):
            A.resolve_backend("varlen", CUDA, torch.float32)
        assert A.resolve_backend("varlen", CUDA, BF16) == "varlen"
    monkeypatch.setattr(A, "varlen_attn", lambda q, k, v, cu_q, cu_k, mq, mk: None)
    with pytest.raises(A.BackendUnavailableError, match="neither window_size nor is_causal"):
        A.resolve_backend("varlen", CUDA, BF16)


@pytest.mark.parametrize("layout", ["packed", "padded", "blocks"])
def test_meta_holds_what_each_backend_needs(fakes, batches, layout) -> None:
    batch = batches[layout]
    rows, t = batch.input_ids.shape
    meta = A.attention_meta(batch, "varlen", dtype=BF16)
    cu = batch.cu_seqlens if layout != "padded" else torch.arange(0, rows * t + 1, t)
    assert meta.backend == "varlen" and torch.equal(meta.cu_seqlens, cu.int())
    assert meta.max_seqlen == t and meta.kernel_kwargs["window_size"] == (-1, 0)
    if layout != "padded":
        tight = A.attention_meta(batch, "varlen", dtype=BF16, max_seqlen="batch")
        assert tight.max_seqlen == batch.max_seqlen == max(batch.cu_seqlens.diff())
        assert layout == "blocks" or tight.max_seqlen < t  # a block holds a 12-token sample
    flex = A.attention_meta(batch, "flex")
    assert flex.block_mask.shape == (rows, 1, t, t) and flex.mask is None
    dense = A.attention_meta(batch, "mask")
    assert torch.equal(dense.mask, batch.attn_mask()) and dense.block_mask is None


def _qkv(rows: int, t: int, heads: int = 4, kv_heads: int = 2, dim: int = 8):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(rows, heads, t, dim, generator=g)
    k, v = (torch.randn(rows, kv_heads, t, dim, generator=g) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize(
    ("layout", "backend"),
    [(lay, b) for lay in ("packed", "padded", "blocks") for b in ("flash", "varlen", "flex")]
    + [("padded", "causal")],  # is_causal only for padded rows (packed: refused, tested above)
)
def test_every_backend_matches_the_dense_mask(fakes, batches, layout, backend) -> None:
    batch = batches[layout]
    q, k, v = _qkv(*batch.input_ids.shape)
    ref = A.packed_attention(q, k, v, A.attention_meta(batch, "mask"))
    got = A.packed_attention(q, k, v, A.attention_meta(batch, backend, dtype=BF16))
    assert torch.isfinite(got).all()  # empty rows / blocks give no NaN
    for r, s, n in spans(batch):  # real tokens agree (padding rows are ignored by the labels)
        assert torch.allclose(got[r, :, s : s + n], ref[r, :, s : s + n], atol=ATOL)
    if backend in ("flash", "varlen"):
        (call,) = fakes[backend]
        n_tok = batch.input_ids.numel()
        assert call["q"] == (n_tok, 4, 8) and call["causal"] is True
        assert call["max"] == batch.input_ids.shape[1]
    if backend == "varlen":
        assert call["k"] == (n_tok, 2, 8) and call["gqa"] is True  # GQA passed to the kernel


def test_kernel_variants_is_causal_and_no_gqa_keyword(monkeypatch, batches) -> None:
    pretend_cuda(monkeypatch)
    batch = batches["packed"]
    q, k, v = _qkv(*batch.input_ids.shape)
    ref = A.packed_attention(q, k, v, batch, backend="mask")
    for keyword, gqa in (("is_causal", True), ("window_size", False)):
        calls: list = []
        monkeypatch.setattr(A, "varlen_attn", fake_varlen(calls, keyword, gqa))
        got = A.packed_attention(q, k, v, batch, backend="varlen")
        assert torch.allclose(got, ref, atol=ATOL) and calls[0]["causal"] is True
        assert calls[0]["k"][1] == 4  # no enable_gqa keyword: the k/v heads are repeated
    bidirectional = A.packed_attention(q, k, v, batch, causal=False, backend="varlen")
    assert calls[-1]["window_size"] == (-1, -1)
    assert torch.allclose(
        bidirectional, A.packed_attention(q, k, v, batch, False, "mask"), atol=ATOL
    )
    with pytest.raises(ValueError, match="causal=False but the meta"):
        A.packed_attention(q, k, v, A.attention_meta(batch, "mask"), causal=False)


@pytest.mark.parametrize("causal", [True, False])
def test_document_block_mask_equals_create_block_mask(causal) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    rng = np.random.default_rng(4)
    for t, block in ((5, 16), (100, 16), (96, 32), (200, 128)):
        seg = torch.as_tensor(np.sort(rng.integers(0, 7, (3, t)), axis=1))
        ours = masks.document_block_mask(seg, causal, block)
        padded = torch.nn.functional.pad(seg, (0, block), value=99)
        ref = create_block_mask(
            masks.document_mask_mod(padded, causal), 3, None, t, t, device="cpu", BLOCK_SIZE=block
        )
        assert torch.equal(ours.to_dense(), ref.to_dense())
        assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)


@pytest.mark.parametrize("layout", ["packed", "blocks"])
@pytest.mark.parametrize("backend", ["segments", "mask", "flex", "varlen", "flash"])
def test_model_packed_equals_each_sample_alone(
    fakes, model, data, batches, layout, backend
) -> None:
    batch = batches[layout]
    with torch.no_grad():
        logits = model(**model_inputs(batch, backend, dtype=BF16))
        for sid, (r, s, n) in zip(batch.sample_ids.tolist(), spans(batch), strict=True):
            alone = model(torch.as_tensor(data[sid])[None], torch.arange(n)[None])[0]
            assert (logits[r, s : s + n] - alone).abs().max() < ATOL


def _train_step(model, batch, backend: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Token losses and gradients of one micro-batch; only ``mask`` builds the dense mask."""
    model.zero_grad(set_to_none=True)
    meta = A.attention_meta(batch, backend)
    assert (meta.mask is None) == (backend != "mask")
    losses = token_losses(model(batch.input_ids, batch.position_ids, meta), batch.labels)
    losses.sum().backward()
    return losses.detach(), [p.grad.clone() for p in model.parameters()]


def test_padded_is_causal_needs_no_mask_and_has_no_nan(model, batches) -> None:
    batch = batches["padded"]
    assert batch.pad_rows == 1
    out = {backend: _train_step(model, batch, backend) for backend in ("causal", "mask")}
    for losses, grads in out.values():
        assert torch.isfinite(losses).all() and all(torch.isfinite(g).all() for g in grads)
    assert float(out["causal"][0].sum()) > 1.0
    assert torch.allclose(out["causal"][0], out["mask"][0], atol=ATOL)
    for a, b in zip(out["causal"][1], out["mask"][1], strict=True):
        assert torch.allclose(a, b, atol=ATOL)


@pytest.mark.parametrize("layout", ["packed", "blocks"])
def test_segments_train_as_the_dense_mask(model, batches, layout) -> None:
    """Sample by sample, the same losses and gradients as the dense mask, and no mask built."""
    batch = batches[layout]
    out = {backend: _train_step(model, batch, backend) for backend in ("segments", "mask")}
    assert float(out["segments"][0].sum()) > 1.0
    assert torch.allclose(out["segments"][0], out["mask"][0], atol=ATOL)
    for a, b in zip(out["segments"][1], out["mask"][1], strict=True):
        assert torch.allclose(a, b, atol=ATOL)


def test_segments_refuse_bidirectional_padded_rows(batches) -> None:
    with pytest.raises(A.BackendUnavailableError, match="must mask the padding"):
        A.attention_meta(batches["padded"], "segments", causal=False)
