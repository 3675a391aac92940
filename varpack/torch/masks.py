"""Attention masks built on the device from ``cu_seqlens`` or segment ids.

Flash-attn's varlen kernels take ``cu_seqlens`` directly. SDPA and eager attention need a mask:
restarting ``position_ids`` alone do not stop a packed sample from attending to the one before it
(DESIGN.md measured logits off by ~0.5 on a Hugging Face Llama). These helpers build the
block-diagonal causal mask with a few vectorised ops on whatever device the inputs live on, with
no host synchronisation (``searchsorted`` instead of ``repeat_interleave``), so they can run
inside a compiled region whose shapes depend only on the token count.

>>> import torch
>>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
>>> segment_ids(cu, 5).tolist()
[0, 0, 1, 1, 1]
>>> causal_mask_from_segments(segment_ids(cu, 5)[None]).int()[0, 0].tolist()
[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
"""

from __future__ import annotations

import torch


def segment_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Segment number (0, 1, ...) of each of ``total`` tokens, from cumulative boundaries."""
    positions = torch.arange(total, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True)


def causal_mask_from_segments(segments: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` segment ids -> ``[B, 1, T, T]`` bool: same segment and not in the future."""
    t = segments.shape[-1]
    same = segments.unsqueeze(-1) == segments.unsqueeze(-2)
    causal = torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()
    return (same & causal).unsqueeze(1)


def block_causal_mask(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Block-diagonal causal mask ``[1, 1, N, N]`` for a packed row of ``total`` tokens."""
    return causal_mask_from_segments(segment_ids(cu_seqlens, total).unsqueeze(0))


def padded_causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The per-sample ``B x T x T`` mask (as ``[B, 1, T, T]``) of a right-padded batch.

    Padding attends causally to padding only, so no query row is empty (SDPA would give NaN).
    """
    return causal_mask_from_segments((attention_mask == 0).to(torch.int32))
