"""Attention masks built on the device from ``cu_seqlens`` or segment ids.

Flash-attn's varlen kernels take ``cu_seqlens`` directly. SDPA and eager attention need a mask:
restarting ``position_ids`` alone do not stop a packed sample from attending to the one before it
(DESIGN.md measured logits off by ~0.5 on a Hugging Face Llama). These helpers build the
block-diagonal causal mask with a few vectorised ops on whatever device the inputs live on, with
no host synchronisation (``searchsorted`` instead of ``repeat_interleave``), so they can run
inside a compiled region whose shapes depend only on the token count.

:func:`document_block_mask` builds FlexAttention's sparse ``BlockMask`` for the same pattern from
the segment ids of each tile's first and last token: ``(T / 128)²`` work, never a ``T x T`` mask.

>>> import torch
>>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
>>> segment_ids(cu, 5).tolist()
[0, 0, 1, 1, 1]
>>> causal_mask_from_segments(segment_ids(cu, 5)[None]).int()[0, 0].tolist()
[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

FLEX_BLOCK = 128  # FlexAttention's default tile: the kernels expect the BlockMask in these units


def segment_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Segment number (0, 1, ...) of each of ``total`` tokens, from cumulative boundaries."""
    positions = torch.arange(total, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True)


def causal_mask_from_segments(segments: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """``[B, T]`` segment ids -> ``[B, 1, T, T]`` bool: same segment (and not in the future)."""
    t = segments.shape[-1]
    same = segments.unsqueeze(-1) == segments.unsqueeze(-2)
    if causal:
        same = same & torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()
    return same.unsqueeze(1)


def block_causal_mask(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Block-diagonal causal mask ``[1, 1, N, N]`` for a packed row of ``total`` tokens."""
    return causal_mask_from_segments(segment_ids(cu_seqlens, total).unsqueeze(0))


def padded_causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The per-sample ``B x T x T`` mask (as ``[B, 1, T, T]``) of a right-padded batch.

    Padding attends causally to padding only, so no query row is empty (SDPA would give NaN).
    """
    return causal_mask_from_segments((attention_mask == 0).to(torch.int32))


def document_mask_mod(segments: torch.Tensor, causal: bool = True) -> Callable[..., Any]:
    """FlexAttention ``mask_mod``: query and key in the same segment (and key not in the future).

    ``segments`` is ``[B, L]`` with ``L`` at least the sequence length rounded up to the tile size
    (the kernels may evaluate the mask on a partial last tile).
    """

    def same_document(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        same = segments[b, q_idx] == segments[b, kv_idx]
        return same & (q_idx >= kv_idx) if causal else same

    return same_document


def _ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile flags ``[B, 1, nq, nk]`` -> (count per query tile, key tile indices, flagged first)."""
    flags = dense.to(torch.int32)
    order = torch.argsort(flags, dim=-1, descending=True, stable=True)
    return flags.sum(-1).to(torch.int32), order.to(torch.int32)


def document_block_mask(
    segments: torch.Tensor, causal: bool = True, block_size: int = FLEX_BLOCK
) -> Any:
    """FlexAttention ``BlockMask`` keeping every segment of ``segments`` ``[B, T]`` to itself.

    Segment ids must be non-decreasing along each row (packed samples, blocks, or a right-padded
    row's real/padding flags). A tile pair is skipped when the two tiles share no segment, "full"
    (no mask evaluated) when both lie inside one segment and, if causal, the key tile is strictly
    earlier, and partial otherwise. Built with ``(T / block_size)²`` element-wise work.
    """
    from torch.nn.attention.flex_attention import BlockMask

    rows, t = segments.shape
    n = -(-t // block_size)
    seg = segments.to(torch.int64)
    if n * block_size > t:  # the partial last tile: a segment of its own
        seg = F.pad(seg, (0, n * block_size - t), value=0)
        seg[:, t:] = seg[:, t - 1 : t] + 1
    tiles = seg.view(rows, n, block_size)
    first, last = tiles[..., 0], tiles[..., -1]  # [B, n]: monotone, so a tile spans first..last
    fq, lq = first[:, :, None], last[:, :, None]  # query tile i
    fk, lk = first[:, None, :], last[:, None, :]  # key tile j
    touch = (fk <= lq) & (lk >= fq)
    full = torch.minimum(fq, fk) == torch.maximum(lq, lk)
    if causal:
        idx = torch.arange(n, device=seg.device)
        touch = touch & (idx[None, :] <= idx[:, None])
        full = full & (idx[None, :] < idx[:, None])
    partial = (touch & ~full).unsqueeze(1)
    counts, indices = _ordered(partial)
    full_counts, full_indices = _ordered(full.unsqueeze(1))
    return BlockMask.from_kv_blocks(
        counts,
        indices,
        full_counts,
        full_indices,
        BLOCK_SIZE=block_size,
        mask_mod=document_mask_mod(seg, causal),
        seq_lengths=(t, t),
    )
