"""Context-parallel replay: what one CP rank computes of a micro-batch, and its attention.

A ``--cp N`` plan records, per sample, the CP rank that holds it whole or -1 (distributed; the
manifest's ``cp_placement``). CP rank ``r`` of a micro-batch computes (:func:`shard`):

* its local samples, whole, first;
* then its share of every distributed sample in the load-balanced layout: the sample cut into
  2N chunks, rank ``r`` holding chunks ``r`` and ``2N-1-r`` (as Megatron and ring attention do,
  so every rank gets as much causal work as the others).

``position_ids`` are the tokens' positions in their sample; ``targets`` are next-token labels
taken on the whole micro-batch before sharding (a chunk's last token is supervised by the next
chunk's first), so :func:`token_loss_sum` needs no shift. Attention (:func:`cp_attention`, the
``cp`` backend of :mod:`varpack.torch.attention`): local samples attend within themselves;
distributed samples all-gather their K/V over the CP group (the Llama 3 approach; differentiable,
so the backward reduce-scatters K/V gradients) and each rank's queries attend, causally by
position, to the whole sample. The masks are dense (this is the reference path, gloo on CPU or
NCCL on GPU); a fused kernel may replace :func:`cp_attention` with the same :class:`CPMeta`.

Global rank ``g`` of a ``dp x cp`` job is DP rank ``g // cp``, CP rank ``g % cp``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
import torch.nn.functional as F

from varpack.errors import InputError
from varpack.torch.attention import AttentionMeta, Backend, register_backend, sdpa
from varpack.torch.batch import IGNORE_INDEX, PackedBatch


class CPRows:
    """A rank's ``cp_placement`` column as flat values + offsets (row ``i``'s placement)."""

    def __init__(self, table: pa.Table, cp_size: int) -> None:
        if "cp_placement" not in table.column_names:
            raise InputError("the plan has no cp_placement column; plan with --cp N")
        col = table.column("cp_placement").combine_chunks()
        self.off = col.offsets.to_numpy().astype(np.int64)
        self.values = col.flatten().to_numpy().astype(np.int64)
        self.cp_size = cp_size

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.off[i] : self.off[i + 1]]


def resolve_cp(
    rank: int | None, world_size: int | None, cp_rank: int | None, cp_size: int | None, cp: int
) -> tuple[int | None, int | None, int, int]:
    """``(dp rank, dp world, cp rank, cp size)``; from the process group where not given.

    ``cp_size=1`` on a ``--cp`` plan reads whole micro-batches (no sharding).
    """
    size = cp if cp_size is None else cp_size
    if size not in (1, cp):
        raise InputError(f"cp_size {size}: the plan was made for --cp {cp} (or pass cp_size=1)")
    if size == 1:
        return rank, world_size, 0, 1
    if cp_rank is None:
        if rank is not None:
            raise InputError(
                "pass cp_rank with rank (or neither: they come from the process group)"
            )
        g, w = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, size)
        if w % size:
            raise InputError(f"world size {w} is not a multiple of the plan's --cp {size}")
        return g // size, w // size, g % size, size
    if not 0 <= cp_rank < size:
        raise InputError(f"cp_rank {cp_rank} is outside the plan's --cp {size} ranks")
    return rank, world_size, cp_rank, size


def _chunks(lens: np.ndarray, n: int) -> np.ndarray:
    """``(k, 2n)`` chunk sizes of each sample cut into 2n near-equal chunks."""
    bounds = (lens[:, None] * np.arange(2 * n + 1)[None, :]) // (2 * n)
    return np.diff(bounds, axis=1)


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + size)`` of every pair (vectorised)."""
    sizes = sizes.astype(np.int64)
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    run = np.repeat(starts.astype(np.int64) - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
    return run + np.arange(total, dtype=np.int64)


def _starts(lens: np.ndarray) -> np.ndarray:
    """Where each sample starts when they are laid back to back."""
    return np.concatenate([[0], np.cumsum(lens)])[:-1].astype(np.int64)


def _owner(n: int) -> np.ndarray:
    """CP rank holding each of the 2n chunks: chunk c and 2n-1-c belong to rank min(c, 2n-1-c)."""
    c = np.arange(2 * n)
    return np.minimum(c, 2 * n - 1 - c)


def _dist_layout(lens: np.ndarray, n: int, r: int) -> dict[str, np.ndarray]:
    """Token offsets of rank r's share of the distributed samples, and the gather order."""
    sizes = _chunks(lens, n)  # (k, 2n)
    owner = _owner(n)
    share = np.stack([sizes[:, j] + sizes[:, 2 * n - 1 - j] for j in range(n)])  # (n, k)
    share_off = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(share, axis=1)], axis=1)
    width = int(share_off[:, -1].max()) if len(lens) else 0
    # gathered position of every chunk: owner's slot, its share offset, second chunk after first
    first = sizes[:, owner]  # (k, 2n): size of the owner's first chunk
    second = np.arange(2 * n)[None, :] != owner[None, :]
    start = owner[None, :] * width + share_off[owner][:, :-1].T + np.where(second, first, 0)
    gather = _ranges(start.reshape(-1), sizes.reshape(-1))
    seg = np.repeat(np.arange(len(lens)), lens)
    sample_start = _starts(lens)
    pos = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(sample_start, lens)
    mine = np.concatenate([[r], [2 * n - 1 - r]])
    chunk_start = (lens[:, None] * np.arange(2 * n + 1)[None, :]) // (2 * n)
    q_pos_start = chunk_start[:, mine]  # (k, 2): where rank r's chunks begin in their sample
    q_sizes = sizes[:, mine]
    return {
        "gather": gather,  # gathered (padded) index of each token in sample order
        "width": np.array(width),
        "k_seg": seg,
        "k_pos": pos,
        "q_start": (sample_start[:, None] + q_pos_start).reshape(-1),
        "q_sizes": q_sizes.reshape(-1),
    }


@dataclass
class CPMeta:
    """What :func:`cp_attention` needs for one CP micro-batch (built once, shared by layers)."""

    n_local: int
    local_mask: torch.Tensor | None  # [1, 1, n_local, n_local]
    dist_mask: torch.Tensor | None  # [1, 1, n_dist, total distributed tokens]
    gather: torch.Tensor | None  # gathered padded K/V index of every distributed token
    width: int  # tokens of the widest rank's share (each rank's K/V padded to it)
    group: Any = None


@dataclass
class CPBatch:
    """One CP rank's part of a packed micro-batch (see the module doc), and the row's figures."""

    input_ids: torch.Tensor  # [1, n]
    position_ids: torch.Tensor  # [1, n]
    targets: torch.Tensor  # [1, n]: next-token label of each token (IGNORE_INDEX where none)
    meta: CPMeta
    cp_rank: int
    cp_size: int
    step: int
    micro: int
    lr_factor: float
    step_tokens: int
    step_samples: int
    is_last_micro: bool
    warmup: bool
    epoch: int
    sample_ids: np.ndarray
    seq_lens: np.ndarray
    placement: np.ndarray

    @property
    def num_tokens(self) -> int:
        """Tokens this CP rank computes."""
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> CPBatch:
        m = self.meta

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        meta = dataclasses.replace(
            m, local_mask=move(m.local_mask), dist_mask=move(m.dist_mask), gather=move(m.gather)
        )
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.to(device, non_blocking=non_blocking),
            position_ids=self.position_ids.to(device, non_blocking=non_blocking),
            targets=self.targets.to(device, non_blocking=non_blocking),
            meta=meta,
        )


def shard(batch: PackedBatch, placement: np.ndarray, cp_rank: int, cp_size: int) -> CPBatch:
    """CP rank ``cp_rank``'s tokens of a packed micro-batch (module doc)."""
    lens = np.asarray(batch.seq_lens, dtype=np.int64)
    if len(placement) != len(lens):
        raise InputError(f"step {batch.step} micro {batch.micro}: cp_placement does not match")
    n, r = cp_size, cp_rank
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    local = placement == r
    dist_k = placement < 0
    local_idx = _ranges(cu[:-1][local], lens[local])
    lay = _dist_layout(lens[dist_k], n, r)
    starts = np.repeat(cu[:-1][dist_k], 2) + lay["q_start"] - np.repeat(_starts(lens[dist_k]), 2)
    dist_idx = _ranges(starts, lay["q_sizes"])
    idx = torch.from_numpy(np.concatenate([local_idx, dist_idx]))
    ids = batch.input_ids[0]
    labels = batch.labels[0]
    nxt = torch.cat([labels[1:], torch.full((1,), IGNORE_INDEX, dtype=labels.dtype)])
    meta = _meta(lens[local], lay, len(local_idx), len(dist_idx), n, r)
    return CPBatch(
        input_ids=ids[idx][None],
        position_ids=batch.position_ids[0][idx][None],
        targets=nxt[idx][None],
        meta=meta,
        cp_rank=r,
        cp_size=n,
        step=batch.step,
        micro=batch.micro,
        lr_factor=batch.lr_factor,
        step_tokens=batch.step_tokens,
        step_samples=batch.step_samples,
        is_last_micro=batch.is_last_micro,
        warmup=batch.warmup,
        epoch=batch.epoch,
        sample_ids=np.asarray(batch.sample_ids),
        seq_lens=lens,
        placement=placement,
    )


def _meta(
    local_lens: np.ndarray, lay: dict[str, np.ndarray], n_local: int, n_dist: int, n: int, r: int
) -> CPMeta:
    local_mask = None
    if n_local:
        seg = torch.from_numpy(np.repeat(np.arange(len(local_lens)), local_lens))
        same = seg[:, None] == seg[None, :]
        local_mask = (same & torch.ones(n_local, n_local, dtype=torch.bool).tril())[None, None]
    dist_mask = gather = None
    width = int(lay["width"])
    if len(lay["k_seg"]):
        k_seg, k_pos = lay["k_seg"], lay["k_pos"]
        q_tok = _ranges(lay["q_start"], lay["q_sizes"])  # this rank's tokens, in sample order
        q_seg, q_pos = k_seg[q_tok], k_pos[q_tok]
        m = (q_seg[:, None] == k_seg[None, :]) & (k_pos[None, :] <= q_pos[:, None])
        dist_mask = torch.from_numpy(m)[None, None]
        gather = torch.from_numpy(lay["gather"])
        assert len(q_tok) == n_dist
    return CPMeta(n_local, local_mask, dist_mask, gather, width)


class _GatherKV(torch.autograd.Function):
    """All-gather along the token dimension; the backward sums each rank's gradient slice over
    the group (reduce-scatter on NCCL; an all-reduce on gloo, whose subgroup all-to-all fails)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, x, group=group)
        return torch.cat(out, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        n = dist.get_world_size(ctx.group)
        stacked = torch.stack(grad.chunk(n, dim=2)).contiguous()
        if dist.get_backend(ctx.group) == dist.Backend.NCCL:
            out = torch.empty_like(stacked[0])
            dist.reduce_scatter_tensor(out, stacked, group=ctx.group)
            return out, None
        dist.all_reduce(stacked, group=ctx.group)
        return stacked[dist.get_rank(ctx.group)], None


def cp_attention(q: Any, k: Any, v: Any, meta: AttentionMeta, scale: float | None) -> Any:
    """Local attention for local samples, all-gathered K/V attention for distributed ones."""
    cp: CPMeta = meta.kernel_kwargs["cp"]
    nl = cp.n_local
    parts = []
    if nl:
        parts.append(sdpa(q[:, :, :nl], k[:, :, :nl], v[:, :, :nl], scale, attn_mask=cp.local_mask))
    if cp.gather is not None:
        kv = torch.cat([k[:, :, nl:], v[:, :, nl:]], dim=-1)
        kv = F.pad(kv, (0, 0, 0, cp.width - kv.shape[2]))
        full = _GatherKV.apply(kv.contiguous(), cp.group)[:, :, cp.gather]
        kd, vd = full.split(k.shape[-1], dim=-1)
        parts.append(sdpa(q[:, :, nl:], kd, vd, scale, attn_mask=cp.dist_mask))
    if not parts:
        return q * 0.0
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


register_backend(Backend("cp", "none", cp_attention, lambda device, dtype: None))


def cp_group(cp_size: int) -> Any:
    """This rank's CP process group: ranks ``g - g % cp .. + cp - 1`` (every rank builds all)."""
    world, g = dist.get_world_size(), dist.get_rank()
    mine = None
    for first in range(0, world, cp_size):
        group = dist.new_group(list(range(first, first + cp_size)))
        if first <= g < first + cp_size:
            mine = group
    return mine


def cp_inputs(batch: CPBatch, group: Any = None) -> dict[str, Any]:
    """Keyword arguments of :meth:`varpack.torch.model.TinyGPT.forward` for a CP batch."""
    meta = AttentionMeta("cp", kernel_kwargs={"cp": dataclasses.replace(batch.meta, group=group)})
    return {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "attn": meta}


def token_loss_sum(logits: torch.Tensor, batch: CPBatch) -> torch.Tensor:
    """Sum of this CP rank's token losses (targets are already next-token labels)."""
    return F.cross_entropy(
        logits[0].float(), batch.targets[0], ignore_index=IGNORE_INDEX, reduction="sum"
    )
