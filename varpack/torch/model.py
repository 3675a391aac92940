"""A small GPT-style reference model for tests, benchmarks and ``jobs/train.py``.

Pre-norm decoder blocks with rotary position embeddings driven by ``position_ids`` (so positions
restart per packed sample), causal self-attention and a GELU MLP. Attention is
:func:`varpack.torch.attention.packed_attention`: flash-attn or torch's varlen kernel over
``cu_seqlens``, FlexAttention with a document ``BlockMask``, SDPA ``is_causal`` for padded rows,
or SDPA with a dense mask on the CPU (see :mod:`varpack.torch.attention`).

What the layers need is built outside :meth:`TinyGPT.forward` (by :func:`model_inputs`, once per
batch, as an :class:`~varpack.torch.attention.AttentionMeta`), so the compiled model's input shapes
depend only on the batch shape, never on how many samples it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from varpack.torch.attention import AttentionMeta, attention_meta, packed_attention


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    rope_base: float = 10000.0


PRESETS = {
    "tiny": GPTConfig(),
    "small": GPTConfig(vocab_size=8192, d_model=256, n_layers=4, n_heads=4),
    "100m": GPTConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12),
}


def _rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate ``x`` [B, H, T, Dh] by the angles of ``pos`` [B, T]."""
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = pos.to(torch.float32)[:, None, :, None] * freq  # [B, 1, T, half]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads, self.base = cfg.n_heads, cfg.rope_base
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, attn: AttentionMeta | None
    ) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = _rope(q, pos, self.base), _rope(k, pos, self.base)
        if attn is None:  # one sample per row, no padding
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = packed_attention(q, k, v, attn)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model),
        )

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, attn: AttentionMeta | None
    ) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), pos, attn)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only LM; ``forward(input_ids, position_ids, attn=None) -> logits``.

    ``attn``: the batch's :class:`~varpack.torch.attention.AttentionMeta` (``None``: plain causal
    attention, one unpadded sample per row).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        """Forward+backward FLOPs per token (6N + attention), for throughput reporting."""
        c = self.cfg
        return 6 * self.num_params() + 12 * c.n_layers * c.d_model * seq_len

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attn: AttentionMeta | None = None
    ) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, position_ids, attn)
        return self.head(self.norm(x))


def model_inputs(
    batch: Any,
    attention: str = "auto",
    dtype: torch.dtype = torch.float32,
    max_seqlen: str = "row",
) -> dict[str, Any]:
    """Keyword arguments of :meth:`TinyGPT.forward` for a varpack batch.

    ``attention``: a backend of :mod:`varpack.torch.attention` (``auto``, ``flash``, ``varlen``,
    ``flex``, ``mask``, ``causal``); ``dtype``: the compute dtype (the autocast dtype);
    ``max_seqlen``: ``"row"`` (constant per shape, for compiled models) or ``"batch"``.
    The attention inputs are built here, once per batch, on the batch's device.
    """
    meta = attention_meta(batch, attention, dtype=dtype, max_seqlen=max_seqlen)
    return {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "attn": meta}


def param_count_str(n: int) -> str:
    """
    >>> param_count_str(113_000_000)
    '113.0M'
    """
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else str(n)


__all__ = ["GPTConfig", "PRESETS", "TinyGPT", "model_inputs"]
