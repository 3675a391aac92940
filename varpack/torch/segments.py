"""Attention sample by sample: SDPA over each packed sample's own tokens, no ``T x T`` mask.

The path for packed and block batches where no varlen kernel runs (the CPU, or a GPU without
flash-attn, ``varlen_attn`` or FlexAttention). A dense mask makes every layer score all ``T x T``
pairs of a row and hold the mask; here a row of samples of ``L_i`` tokens scores ``sum(L_i^2)``
pairs: eight samples of 500 tokens in a 4,096-token row are 8x less work (about 8x faster on a CPU,
forward and backward), and nothing of size ``T^2`` is built. One SDPA call per sample and layer:
the loop is over one micro-batch's samples (tens), never over a dataset.

Tokens outside every segment (a packed row's tail padding, the padding between block rows'
samples) get zeros: no label reads them.

>>> import torch
>>> q = k = v = torch.randn(1, 2, 6, 4)
>>> y = segment_attention(q, k, v, ((0, 2), (2, 5)), causal=True, scale=None)
>>> y.shape, bool(y[0, :, 5].abs().sum() == 0)  # token 5 is padding
(torch.Size([1, 2, 6, 4]), True)
>>> alone = torch.nn.functional.scaled_dot_product_attention(
...     q[:, :, 2:5], k[:, :, 2:5], v[:, :, 2:5], is_causal=True)
>>> torch.allclose(y[:, :, 2:5], alone)  # sample 1 sees only itself
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def segment_bounds(cu_seqlens: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """``(start, end)`` of every non-empty segment of the flattened ``[B * T]`` view.

    >>> segment_bounds(torch.tensor([0, 3, 3, 7]))
    ((0, 3), (3, 7))
    """
    cu = cu_seqlens.tolist()
    return tuple((a, b) for a, b in zip(cu[:-1], cu[1:], strict=True) if b > a)


def _flat(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b * t, h, d)


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: tuple[tuple[int, int], ...],
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """``[B, H, T, D]`` attention with each ``(start, end)`` of ``bounds`` (over the flattened
    ``B * T`` tokens, ascending) attending only to itself; ``k``/``v`` may have fewer heads (GQA)."""
    b, h, t, d = q.shape
    qf, kf, vf = _flat(q), _flat(k), _flat(v)
    gqa = k.shape[1] != h
    parts, at = [], 0
    for start, end in bounds:
        if start > at:
            parts.append(qf.new_zeros(start - at, h, d))
        qs, ks, vs = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (qf, kf, vf))
        y = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=gqa
        )
        parts.append(y[0].transpose(0, 1))
        at = end
    if at < b * t:
        parts.append(qf.new_zeros(b * t - at, h, d))
    return torch.cat(parts).view(b, t, h, d).transpose(1, 2)
