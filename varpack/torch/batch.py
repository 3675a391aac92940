"""The micro-batch dataclasses the reader yields, one per manifest row.

Every batch carries the plan's bookkeeping for its micro-batch (``step``, ``micro``, ``lr_factor``,
``step_tokens``, ``step_samples``, ``is_last_micro``, ``warmup``) next to its tensors, and the
plan's carried metadata columns (``varpack plan --carry COL``) in ``carry``: ``carry["COL"]`` holds
one value per sample, parallel to ``sample_ids``, as a tensor (integers int64, floats float64,
booleans bool) or, for strings, a list of ``str`` (which ``to`` and ``pin_memory`` leave as it is).
Three layouts:

- :class:`PackedBatch`: the samples concatenated into one row ``[1, N]`` (varlen / "thd"), with
  ``cu_seqlens`` (int32, the padding tail counted as one more segment) and ``max_seqlen``, the
  fields of Megatron's ``PackedSeqParams`` and flash-attn's varlen kernels.
- :class:`PaddedBatch`: ``[B, T]``, one sample per row (plus ``pad_rows`` empty rows).
- :class:`BlockBatch`: ``[num_blocks, T]``, whole samples packed into fixed-length blocks (BLoad),
  with the reset table (start offset of every sample in its block).

Labels are aligned with ``input_ids`` (the Hugging Face convention): ``labels[t] = input_ids[t]``
except the first token of every sample and every padding position, which are ``IGNORE_INDEX``.
The loss shifts by one (logits at ``t`` predict ``labels[t + 1]``, see :mod:`varpack.torch.loss`),
so no sample ever predicts a token of its neighbour in a packed row.

Tensors stay on the CPU until :meth:`to` moves them; masks are built on the device on demand
(:mod:`varpack.torch.masks`), never shipped through the DataLoader.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from varpack.torch import masks

IGNORE_INDEX = -100

B = TypeVar("B", bound="BatchInfo")


@dataclass
class BatchInfo:
    """Plan bookkeeping shared by every layout (the tensors live in the subclasses)."""

    step: int
    micro: int
    lr_factor: float
    step_tokens: int
    step_samples: int  # sequences of the global step: a piece of a split document counts as one
    is_last_micro: bool
    warmup: bool
    epoch: int
    sample_ids: torch.Tensor  # int64 [num_samples]
    seq_lens: torch.Tensor  # int32 [num_samples]
    # carried metadata columns: name -> [num_samples] tensor, or list of str (parallel to sample_ids)
    carry: dict[str, torch.Tensor | list[str]] = field(default_factory=dict, kw_only=True)
    # --oversize split: each piece's first token in its document, parallel to sample_ids
    # (int64 [num_samples]); None for plans that split nothing
    sample_offsets: torch.Tensor | None = field(default=None, kw_only=True)

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens in this micro-batch."""
        return int(self.seq_lens.sum())

    @property
    def label_tokens(self) -> int:
        """Supervised tokens of the whole global step: each sample (each piece of a split
        document too) predicts all but its first token."""
        return self.step_tokens - self.step_samples

    def to(self: B, device: torch.device | str, non_blocking: bool = False) -> B:
        """A copy with every tensor on ``device`` (ints and flags unchanged)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self: B) -> B:
        """Called by ``DataLoader(pin_memory=True)`` on custom batch types."""
        return self._map(lambda t: t.pin_memory())

    def _map(self: B, fn: Any) -> B:
        changes: dict[str, Any] = {
            f.name: fn(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        changes["carry"] = {
            k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in self.carry.items()
        }
        return dataclasses.replace(self, **changes)


@dataclass
class PackedBatch(BatchInfo):
    """Samples concatenated into one row of ``pad_to`` tokens; the padding tail is one segment."""

    input_ids: torch.Tensor  # int64 [1, N]
    position_ids: torch.Tensor  # int64 [1, N], restarting at 0 for every segment
    labels: torch.Tensor  # int64 [1, N]
    cu_seqlens: torch.Tensor  # int32 [segments + 1]: 0, ends of every sample, N
    max_seqlen: int  # longest segment (padding tail included), a Python int: no device sync

    @property
    def shape(self) -> tuple[int, int]:
        return (1, int(self.input_ids.shape[1]))

    def segment_ids(self) -> torch.Tensor:
        """``[1, N]`` segment number of every token (built on the batch's device)."""
        return masks.segment_ids(self.cu_seqlens, self.input_ids.shape[1]).unsqueeze(0)

    def attn_mask(self) -> torch.Tensor:
        """Block-diagonal causal mask ``[1, 1, N, N]`` (bool, True = may attend) for SDPA/eager."""
        return masks.causal_mask_from_segments(self.segment_ids())

    def packed_seq_params(self) -> dict[str, Any]:
        """The fields of Megatron-Core's ``PackedSeqParams`` (``qkv_format='thd'``)."""
        return {
            "qkv_format": "thd",
            "cu_seqlens_q": self.cu_seqlens,
            "cu_seqlens_kv": self.cu_seqlens,
            "max_seqlen_q": self.max_seqlen,
            "max_seqlen_kv": self.max_seqlen,
        }


@dataclass
class PaddedBatch(BatchInfo):
    """One sample per row, right-padded to ``T``; ``pad_rows`` trailing rows hold no sample."""

    input_ids: torch.Tensor  # int64 [B, T]
    position_ids: torch.Tensor  # int64 [B, T]
    labels: torch.Tensor  # int64 [B, T]
    attention_mask: torch.Tensor  # int64 [B, T], 1 on real tokens (Hugging Face convention)
    pad_rows: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))

    def segment_ids(self) -> torch.Tensor:
        """``[B, T]``: 0 on real tokens, 1 on padding (padding attends only to padding)."""
        return (self.attention_mask == 0).to(torch.int32)

    def attn_mask(self) -> torch.Tensor:
        """The per-sample ``B x T x T`` causal mask as ``[B, 1, T, T]`` bool (the blog's mask).

        Padding positions attend causally to padding only, so no row is fully masked (a fully
        masked row makes SDPA return NaN) and real tokens never see padding.
        """
        return masks.causal_mask_from_segments(self.segment_ids())


@dataclass
class BlockBatch(BatchInfo):
    """Whole samples packed into fixed-length blocks ``[num_blocks, T]`` (BLoad), tails padded.

    ``sample_ids``, ``seq_lens``, ``block_index`` and ``starts`` are in block order: sample ``i``
    occupies ``input_ids[block_index[i], starts[i] : starts[i] + seq_lens[i]]``. ``resets`` marks
    those start positions (the reset table as a dense flag, for recurrent models).
    """

    input_ids: torch.Tensor  # int64 [num_blocks, T]
    position_ids: torch.Tensor  # int64 [num_blocks, T]
    labels: torch.Tensor  # int64 [num_blocks, T]
    attention_mask: torch.Tensor  # int64 [num_blocks, T], 1 on real tokens
    block_index: torch.Tensor  # int32 [num_samples]
    starts: torch.Tensor  # int32 [num_samples], offset of each sample in its block
    resets: torch.Tensor  # bool [num_blocks, T], True where a sample starts
    cu_seqlens: torch.Tensor  # int32, segments of the flattened [num_blocks * T] view
    max_seqlen: int
    pad_rows: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))

    def segment_ids(self) -> torch.Tensor:
        """``[num_blocks, T]`` segment numbers (segments never cross a block boundary)."""
        nb, t = self.input_ids.shape
        return masks.segment_ids(self.cu_seqlens, nb * t).view(nb, t)

    def attn_mask(self) -> torch.Tensor:
        """Per-block block-diagonal causal mask ``[num_blocks, 1, T, T]`` (bool)."""
        return masks.causal_mask_from_segments(self.segment_ids())


Batch = PackedBatch | PaddedBatch | BlockBatch
