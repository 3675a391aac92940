"""Loss per sample, and per group of a carried column (per source, per language), for logging.

With ``varpack plan --carry source`` every batch holds ``batch.carry["source"]``, one value per
sample. :func:`sample_losses` turns the per-token losses of :func:`varpack.torch.loss.token_losses`
into one loss sum per sample (whatever the layout: packed, padded or blocks), and
:func:`group_losses` adds them up per distinct value of a carried column. Everything stays on the
batch's device (no synchronisation) except the keys, which are read on the CPU::

    losses = token_losses(logits, batch.labels)
    keys, loss_sum, tokens = group_losses(batch, losses, "source")
    # mean loss of each source in this micro-batch: loss_sum / tokens (log every N steps)

The mean of a group is its loss sum over its supervised tokens (each sample of ``L`` tokens has
``L - 1``, as in :mod:`varpack.torch.loss`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from varpack.errors import ConfigError


def token_samples(batch: Any) -> torch.Tensor:
    """``input_ids``-shaped map of each position's sample (its index in ``sample_ids``), -1 on
    padding; for :class:`~varpack.torch.batch.BlockBatch`, samples in its block order."""
    lens = batch.seq_lens.to(torch.int64)
    count = len(lens)
    device = lens.device
    owner = torch.repeat_interleave(torch.arange(count, device=device), lens)
    out = torch.full(batch.input_ids.shape, -1, dtype=torch.int64, device=device)
    if hasattr(batch, "block_index"):  # blocks: sample i at [block_index[i], starts[i]:+len]
        t = batch.input_ids.shape[1]
        start = batch.block_index.to(torch.int64) * t + batch.starts.to(torch.int64)
        first = torch.cumsum(lens, 0) - lens
        within = torch.arange(len(owner), device=device) - torch.repeat_interleave(first, lens)
        out.view(-1)[torch.repeat_interleave(start, lens) + within] = owner
    elif hasattr(batch, "cu_seqlens"):  # packed: samples back to back in one row
        out.view(-1)[: len(owner)] = owner
    else:  # padded: sample i is row i
        rows = torch.arange(out.shape[0], device=device)[:, None].expand_as(out)
        out[:count] = torch.where(batch.attention_mask[:count] > 0, rows[:count], -1)
    return out


def sample_losses(batch: Any, losses: torch.Tensor) -> torch.Tensor:
    """Loss sum of every sample ``[num_samples]`` from per-token ``losses`` ``[B, T - 1]``
    (logits at ``t`` against ``labels[t + 1]``: the loss belongs to the sample of ``t + 1``)."""
    owner = token_samples(batch)[:, 1:].reshape(-1)
    flat = losses.reshape(-1)
    keep = owner >= 0
    out = torch.zeros(len(batch.seq_lens), dtype=flat.dtype, device=flat.device)
    return out.index_add_(0, owner[keep], flat[keep])


def group_losses(
    batch: Any, losses: torch.Tensor, column: str
) -> tuple[list[Any], torch.Tensor, torch.Tensor]:
    """``(keys, loss_sums, label_tokens)`` per distinct value of the carried ``column``, keys
    sorted; ``loss_sums[g] / label_tokens[g]`` is group ``g``'s mean token loss."""
    if column not in batch.carry:
        have = ", ".join(sorted(batch.carry)) or "none"
        raise ConfigError(
            f"the batch carries no column {column!r} (carried: {have}); plan with --carry {column}"
        )
    values = batch.carry[column]
    raw = values.cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    keys, inverse = np.unique(raw, return_inverse=True)
    per_sample = sample_losses(batch, losses)
    group = torch.from_numpy(inverse.astype(np.int64)).to(per_sample.device)
    loss_sums = torch.zeros(len(keys), dtype=per_sample.dtype, device=per_sample.device)
    loss_sums.index_add_(0, group, per_sample)
    tokens = torch.zeros(len(keys), dtype=torch.int64, device=per_sample.device)
    tokens.index_add_(0, group, batch.seq_lens.to(torch.int64).to(per_sample.device) - 1)
    return keys.tolist(), loss_sums, tokens


class GroupTally:
    """Loss sums and supervised tokens per group, summed over micro-batches and steps until
    :meth:`flush`, which merges every rank's groups (a rank may see groups the others do not).

    >>> t = GroupTally()
    >>> t.add(["a", "b"], torch.tensor([2.0, 3.0]), torch.tensor([4, 1]))
    >>> t.add(["a"], torch.tensor([1.0]), torch.tensor([2]))
    >>> t.line(t.flush())
    'a 0.5000 (6 tok) | b 3.0000 (1 tok)'
    """

    def __init__(self) -> None:
        self._parts: list[tuple[list[Any], torch.Tensor, torch.Tensor]] = []

    def add(self, keys: list[Any], loss_sums: torch.Tensor, tokens: torch.Tensor) -> None:
        """One micro-batch's :func:`group_losses` (kept on the device until the flush)."""
        self._parts.append((keys, loss_sums.detach(), tokens.detach()))

    def flush(self) -> dict[Any, tuple[float, int]]:
        """``{key: (loss sum, tokens)}`` over everything added on every rank; then empty."""
        mine: dict[Any, tuple[float, int]] = {}
        for keys, sums, toks in self._parts:
            for key, s, n in zip(keys, sums.tolist(), toks.tolist(), strict=True):
                a, b = mine.get(key, (0.0, 0))
                mine[key] = (a + s, b + n)
        self._parts = []
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return mine
        every: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, mine)
        merged: dict[Any, tuple[float, int]] = {}
        for part in every:
            for key, (s, n) in part.items():
                a, b = merged.get(key, (0.0, 0))
                merged[key] = (a + s, b + n)
        return merged

    @staticmethod
    def line(groups: dict[Any, tuple[float, int]]) -> str:
        """Each group's mean token loss and its supervised tokens, by key."""
        return " | ".join(
            f"{k} {s / max(n, 1):.4f} ({n:,} tok)" for k, (s, n) in sorted(groups.items())
        )
