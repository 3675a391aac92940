"""Test helpers for attention: small batches of every layout and fake CUDA-only kernels.

The fakes stand in for flash-attn's ``flash_attn_varlen_func`` and torch's ``varlen_attn`` on the
CPU. They record their arguments and compute exact attention segment by segment from
``cu_seqlens``, so a test proves the wiring (flattened layout, ``cu_seqlens``, ``max_seqlen``,
the causal keyword, GQA) and the numbers at once. :func:`traceable_varlen` computes the same from
a dense mask built from ``cu_seqlens``, with no Python loop, so dynamo can trace it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from plan_helpers import make_plan

from varpack.torch import PlanLoader
from varpack.torch import attention as attn_mod
from varpack.torch.masks import causal_mask_from_segments, segment_ids

LENS = {11: 7, 12: 3, 13: 12, 14: 1, 15: 9, 16: 5}


def sample_tokens(vocab: int = 256, seed: int = 3) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.integers(1, vocab, n) for i, n in LENS.items()}


def layout_batches(tmp: Path, data: dict[int, np.ndarray]) -> dict[str, Any]:
    """One batch per layout, each with padding: a packed tail, an empty row, an empty block."""
    micro = [list(LENS)]
    plans = {
        "packed": make_plan(tmp / "packed", LENS, micros=micro, pad_multiple=16),
        "padded": make_plan(tmp / "padded", LENS, layout="padded", micros=micro, pad_rows=[1]),
        "blocks": make_plan(
            tmp / "blocks", LENS, blocks=[[[11, 12], [13], [14, 15], [16]]], block_len=12,
            pad_rows=[1],
        ),
    }  # fmt: skip
    return {k: next(iter(PlanLoader(p, data, rank=0))) for k, p in plans.items()}


def spans(batch: Any) -> list[tuple[int, int, int]]:
    """(row, start, length) of every sample, from the batch's own bookkeeping."""
    lens = batch.seq_lens.tolist()
    if hasattr(batch, "starts"):
        return list(zip(batch.block_index.tolist(), batch.starts.tolist(), lens, strict=True))
    if hasattr(batch, "cu_seqlens"):
        return [(0, s, n) for s, n in zip(batch.cu_seqlens.tolist(), lens, strict=False)]
    return [(r, 0, n) for r, n in enumerate(lens)]


def segment_loop(q: Any, k: Any, v: Any, cu: Any, causal: bool, scale: Any = None) -> Any:
    """Exact attention over ``[N, H, D]`` tensors, one SDPA call per ``cu_seqlens`` segment."""
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (x[s:e].transpose(0, 1) for x in (q, k, v))
        y = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=ks.shape[0] != qs.shape[0]
        )
        out[s:e] = y.transpose(0, 1)
    return out


def _record(calls: list[dict[str, Any]], q: Any, k: Any, cu: Any, max_q: int, **kw: Any) -> None:
    longest = int((cu[1:] - cu[:-1]).max())
    assert longest <= max_q, "max_seqlen must bound every segment"
    calls.append({"q": tuple(q.shape), "k": tuple(k.shape), "cu": cu.clone(), "max": max_q, **kw})


def fake_varlen(calls: list[dict[str, Any]], keyword: str = "window_size", gqa: bool = True) -> Any:
    """A ``varlen_attn`` look-alike: causal via ``window_size`` (with or without ``enable_gqa``
    in its signature) or via ``is_causal``."""

    def run(
        q: Any, k: Any, v: Any, cu: Any, max_q: int, causal: bool, scale: Any, **kw: Any
    ) -> Any:
        _record(calls, q, k, cu, max_q, causal=causal, **kw)
        return segment_loop(q, k, v, cu, causal, scale)

    def window(
        q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
    ):
        assert torch.equal(cu_q, cu_k) and max_q == max_k
        assert enable_gqa == (k.shape[1] != q.shape[1])
        causal = tuple(window_size) == (-1, 0)
        return run(
            q, k, v, cu_q, max_q, causal, scale, window_size=tuple(window_size), gqa=enable_gqa
        )

    def window_no_gqa(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        assert k.shape[1] == q.shape[1], "without enable_gqa the caller repeats the k/v heads"
        return window(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size)

    def is_causal(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, is_causal=False):
        return run(q, k, v, cu_q, max_q, is_causal, scale)

    if keyword == "is_causal":
        return is_causal
    return window if gqa else window_no_gqa


def fake_flash(calls: list[dict[str, Any]]) -> Any:
    """A ``flash_attn_varlen_func`` look-alike (flash-attn's positional order and keywords)."""

    def flash(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False):
        _record(calls, q, k, cu_q, max_q, causal=causal, dropout_p=dropout_p, scale=softmax_scale)
        return segment_loop(q, k, v, cu_q, causal, softmax_scale)

    return flash


def traceable_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
    """``varlen_attn`` semantics with no Python loop (dynamo traces it; cu_seqlens may be dynamic).

    Like the real kernel, the result depends on ``max_q`` (here: ``+ 0 * max_q``), so a compiled
    model specialises on it exactly as it would on the real op's int argument.
    """
    seg = segment_ids(cu_q, q.shape[0]).unsqueeze(0)
    mask = causal_mask_from_segments(seg, tuple(window_size) == (-1, 0))  # [1, 1, N, N]
    y = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0), attn_mask=mask, scale=scale,
    )  # fmt: skip
    return y[0].transpose(0, 1) + 0 * max_q


def pretend_cuda(monkeypatch: Any, capability: tuple[int, int] = (9, 0)) -> None:
    """Let the CUDA-only backends resolve on the CPU (with fake kernels standing in)."""
    monkeypatch.setattr(attn_mod, "_cuda_half", lambda device, dtype: None)
    monkeypatch.setattr(attn_mod, "cuda_capability", lambda device: capability)
