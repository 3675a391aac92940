"""A rollout batch as RL frameworks hold it, cut into a plan's micro-batches, outputs put back.

:class:`Rollout` takes a batch as verl's ``DataProto`` / a ``TensorDict`` holds it: a dict of
padded tensors, ``input_ids`` ``[B, T]`` and ``attention_mask`` ``[B, T]`` (1 on real tokens; left-
or right-padded, or both: left-padded prompts followed by right-padded responses), and any others:

* ``[B, T]`` (``position_ids`` ...): one value per token; ``position_ids`` may also be
  ``[B, k, T]`` (Qwen2-VL's mRoPE as verl holds it: ``k`` position streams), packed per sample
  along the last axis into ``[k, 1, N]`` (padded layout: ``[k, B, T]``), as the model takes it;
* ``[B, W]`` with ``W < T`` (``responses``, ``response_mask``, ``old_log_probs``, ``advantages``
  ...): one value per token of each row's response, its first token in column 0, as verl holds
  responses: in verl's layout (prompts left-padded to ``T - W`` columns, responses right-padded
  after them) the last ``W`` columns; in right- or left-padded rows the ``W`` columns from where
  the ``response_mask`` puts the response (its last mark on the row's last real token); a layout
  the masks leave ambiguous is refused (:mod:`varpack.torch.rollout_layout`). ``prompts``
  ``[B, P]``: the ``P`` columns before each row's response;
* ``[B]``, or a list / NumPy array of ``B`` entries (scores, uids): one value per sample.

Or a list of 1-D token tensors of any lengths. :attr:`Rollout.lengths` are the tokens of each
sample, what :func:`varpack.online.plan_batch` plans; :meth:`Rollout.micro_batches` gives a
rank's micro-batches of a step as varpack batches (:class:`PackedRollout`: one row with
``cu_seqlens`` and ``position_ids`` (the batch's own where it has them, else counted from each
sample's start); :class:`PaddedRollout`: ``[B, T]`` right-padded), every per-token field packed
alongside ``input_ids`` in ``fields`` and every per-sample one in ``carry``; and
:meth:`Rollout.restore` puts per-token outputs (log-probs, values) back into ``[B, W]`` in the
batch's order. :func:`gather_outputs` sums every rank's part into the whole batch;
:func:`gather_lengths` gives every rank the whole batch's lengths when each holds a shard.

Imports: torch, and :mod:`varpack.online` for the plan it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from varpack.errors import InputError
from varpack.online import BatchPlan
from varpack.torch.batch import IGNORE_INDEX, PackedBatch, PaddedBatch
from varpack.torch.collate import pack_packed, pack_padded
from varpack.torch.rollout_input import (
    INTEGER,
    batch_tensor,
    check_integers,
    check_mask,
    check_outputs,
    check_plan,
    entry_kind,
    plan_index,
    position_entry,
    restore_width,
)
from varpack.torch.rollout_layout import PROMPTS, Rows, response_part, row_spans

#: the positions entry: the micro-batches' position_ids
POSITIONS = "position_ids"
#: the response mask, a 0/1 entry of the response part (verl's name)
RESPONSE_MASK = "response_mask"


@dataclass
class PackedRollout(PackedBatch):
    """A micro-batch of a rollout, packed: ``fields[name]`` ``[1, N]`` aligned with ``input_ids``
    (0 in the padding tail); ``step_loss_tokens``: the step's loss tokens over all ranks;
    ``position_ids`` ``[1, N]``, or ``[k, 1, N]`` from mRoPE positions ``[B, k, T]``."""

    fields: dict[str, torch.Tensor] = field(default_factory=dict, kw_only=True)
    step_loss_tokens: int = field(default=0, kw_only=True)

    def _map(self, fn: Any) -> Any:
        out = super()._map(fn)
        out.fields = {k: fn(v) for k, v in self.fields.items()}
        return out


@dataclass
class PaddedRollout(PaddedBatch):
    """A micro-batch of a rollout, one sample a row: ``fields[name]`` ``[B, T]`` like
    ``input_ids`` (0 on padding); ``position_ids`` ``[B, T]``, or ``[k, B, T]`` (mRoPE)."""

    fields: dict[str, torch.Tensor] = field(default_factory=dict, kw_only=True)
    step_loss_tokens: int = field(default=0, kw_only=True)

    def _map(self, fn: Any) -> Any:
        out = super()._map(fn)
        out.fields = {k: fn(v) for k, v in self.fields.items()}
        return out


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ranges ``starts[i] .. starts[i] + counts[i] - 1``."""
    ends = np.cumsum(counts)
    return np.repeat(starts - ends + counts, counts) + np.arange(int(ends[-1]) if len(ends) else 0)


class Rollout:
    """A rollout batch, its real tokens flattened once (see the module doc)."""

    def __init__(
        self, data: Any, mask: str = "attention_mask", response_mask: str = RESPONSE_MASK
    ) -> None:
        """``data``: a dict (or a ``TensorDict``: anything with ``items()``), verl's
        ``DataProto`` (its ``batch`` and ``non_tensor_batch``), or a list of 1-D tensors.
        ``mask``: the entry marking each row's real tokens; ``response_mask``: the ``[B, W]``
        entry marking its response tokens (where the rows are not in verl's layout, its last
        mark on each row's last real token says where the response lies: see
        :mod:`varpack.torch.rollout_layout`)."""
        self.response_width: int | None = None  # W of the [B, W] entries (None: none)
        self._response_starts: np.ndarray | None = None  # each row's first response column
        self._per_token: dict[str, torch.Tensor] = {}
        self._per_sample: dict[str, Any] = {}
        if hasattr(data, "batch") and hasattr(data, "non_tensor_batch"):  # a DataProto
            data = {**dict(data.batch.items()), **dict(data.non_tensor_batch)}
        if isinstance(data, list | tuple):
            self._from_list(data)
        elif hasattr(data, "items"):
            self._from_padded(dict(data.items()), mask, response_mask)
        else:
            raise InputError(
                f"a rollout is a dict of tensors or a list of them, not {type(data).__name__}"
            )
        self.starts = np.concatenate(([0], np.cumsum(self.lengths)))  # each sample's first token
        self._checked: BatchPlan | None = None  # the last plan found to be of this batch

    def _from_list(self, seqs: Sequence[torch.Tensor]) -> None:
        if not len(seqs) or any(not isinstance(t, torch.Tensor) or t.dim() != 1 for t in seqs):
            raise InputError("a rollout list holds 1-D token tensors, at least one")
        for dtype in {t.dtype for t in seqs}:  # the first of each dtype, should it be refused
            i = next(i for i, t in enumerate(seqs) if t.dtype == dtype)
            check_integers(f"rollout[{i}]", seqs[i])
        self.lengths = np.array([len(t) for t in seqs], dtype=np.int64)
        self.width = int(self.lengths.max())
        self._per_token["input_ids"] = torch.cat(list(seqs)).long()
        self._rows = torch.from_numpy(np.repeat(np.arange(len(seqs)), self.lengths))
        self._cols = torch.from_numpy(_ranges(np.zeros(len(seqs), np.int64), self.lengths))
        self._spans = Rows(np.zeros(len(seqs), np.int64), self.lengths, self.lengths)

    def _from_padded(self, data: Mapping[str, Any], mask: str, response_mask: str) -> None:
        if "input_ids" not in data or mask not in data:
            raise InputError(f"a rollout dict needs input_ids and {mask} ([batch, length] tensors)")
        ids, valid = batch_tensor("input_ids", data["input_ids"]), batch_tensor(mask, data[mask])
        if valid.shape != ids.shape:
            raise InputError(f"input_ids {tuple(ids.shape)} and {mask} {tuple(valid.shape)}: "
                             "two [batch, length] tensors of one shape")  # fmt: skip
        check_integers("input_ids", ids)
        check_mask(mask, valid)
        b, t = ids.shape
        keep = valid.bool()
        self.lengths = keep.sum(dim=1).numpy().astype(np.int64)
        if (self.lengths == 0).any():
            raise InputError(f"row {int(np.argmin(self.lengths))} of {mask} has no real token")
        self.width = t
        rows, cols = keep.nonzero(as_tuple=True)  # row by row: each sample's tokens in order
        self._rows, self._cols = rows, cols
        self._spans = row_spans(keep)
        tokens: dict[str, torch.Tensor] = {}
        for name, value in data.items():
            if name == mask:
                continue
            if entry_kind(name, value, b) == "token":
                if name == POSITIONS:  # [B, T], or [B, k, T] (mRoPE): [B, T, k] per token
                    value = position_entry(value, t)
                if name in INTEGER:
                    check_integers(name, value)
                elif name == response_mask:
                    check_mask(name, value)
                if value.shape[1] > t:
                    raise InputError(f"{name} {tuple(value.shape)} is wider than input_ids ({t})")
                tokens[name] = value
            else:
                self._per_sample[name] = value
        part = response_part(tokens, self._spans, self.width, (mask, response_mask), ids)
        starts = None
        if part is not None:
            self.response_width, starts = part
            self._response_starts = starts
        for name, value in tokens.items():
            first = None if value.shape[1] == t else starts
            if name == PROMPTS and first is not None:  # the columns before the response
                first = first - value.shape[1]
            self._per_token[name] = self._flatten(value, first)

    def _flatten(self, value: torch.Tensor, first: np.ndarray | None) -> torch.Tensor:
        """A per-token field's value at every real token: ``[B, T]``, or ``[B, W]`` whose column
        ``c`` of row ``i`` is the token at column ``first[i] + c`` (0 on tokens it misses)."""
        if first is None:
            return value[self._rows, self._cols]
        col = self._cols - torch.from_numpy(first)[self._rows]
        inside = (col >= 0) & (col < value.shape[1])
        out = torch.zeros((len(col), *value.shape[2:]), dtype=value.dtype)
        out[inside] = value[self._rows[inside], col[inside]]
        return out

    def loss_tokens(self, key: str = "response_mask") -> np.ndarray:
        """Tokens of each sample a per-token 0/1 field counts (``plan_batch(loss_tokens=...)``)."""
        if key not in self._per_token:
            held = ", ".join(sorted(self._per_token))
            raise InputError(f"loss_tokens({key!r}): this rollout has no per-token entry "
                             f"{key!r}; it has {held}")  # fmt: skip
        flat = self._per_token[key]
        why = f"{tuple(flat.shape[1:])} values a token" if flat.dim() != 1 else None
        if why is None and (flat.dtype.is_floating_point or flat.dtype.is_complex):
            why = str(flat.dtype)
        if why is None and flat.dtype != torch.bool:
            bad = torch.nonzero((flat != 0) & (flat != 1))
            if len(bad):
                k = int(bad[0, 0])
                why = (
                    f"row {int(self._rows[k])}, column {int(self._cols[k])} holds {flat[k].item()}"
                )
        if why is not None:
            raise InputError(f"loss_tokens({key!r}): {key} is no 0/1 mask ({why}); count a "
                             f"mask such as {RESPONSE_MASK}")  # fmt: skip
        return np.bincount(
            self._rows.numpy(), weights=flat.numpy(), minlength=len(self.lengths)
        ).astype(np.int64)

    def micro_batches(
        self, plan: BatchPlan, rank: int, step: int
    ) -> list[PackedRollout | PaddedRollout]:
        """Rank ``rank``'s micro-batches of step ``step``, in the order it runs them."""
        self._check_plan(plan)
        layout = plan.arrays.cfg.layout
        rank = plan_index("rank", rank, plan.dp, f"dp={plan.dp} ranks")
        step = plan_index("step", step, plan.num_steps, "steps")
        mbs = plan.rank_steps(rank)[step]
        starts = plan.piece_starts[step][rank] if plan.piece_starts is not None else None
        sizes = plan.piece_lengths[step][rank] if plan.piece_lengths is not None else None
        pad_to = plan.pad_to(step, rank)
        out: list[PackedRollout | PaddedRollout] = []
        for j, idx in enumerate(mbs):
            first = np.zeros(len(idx), np.int64) if starts is None else starts[j]
            lens = self.lengths[idx] if sizes is None else sizes[j]
            info = dict(
                step=step, micro=j, lr_factor=1.0, step_tokens=int(plan.step_tokens[step]),
                step_samples=int(plan.step_samples[step]), is_last_micro=j == len(mbs) - 1,
                warmup=False, epoch=0, sample_ids=torch.from_numpy(idx.copy()),
                seq_lens=torch.from_numpy(lens.astype(np.int32)),
                carry=self._carry(idx), step_loss_tokens=int(plan.step_loss_tokens[step]),
                sample_offsets=None if starts is None else torch.from_numpy(first.copy()),
            )  # fmt: skip
            pos = torch.from_numpy(_ranges(self.starts[idx] + first, lens))
            if layout == "packed":
                out.append(self._packed(pos, lens, first, int(pad_to[j]), info))
            else:
                out.append(self._padded(pos, lens, first, int(pad_to[j]), info))
        return out

    def _check_plan(self, plan: BatchPlan) -> None:
        """``plan`` is of this batch (:func:`check_plan`), checked once a plan."""
        if plan is not self._checked:
            check_plan(plan, self.lengths)
            self._checked = plan

    def _carry(self, idx: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in self._per_sample.items():
            if isinstance(value, torch.Tensor):
                out[name] = value[torch.from_numpy(idx)]
            else:
                out[name] = [value[int(i)] for i in idx]
        return out

    def _packed(self, pos: torch.Tensor, lens: np.ndarray, first: np.ndarray, pad_to: int,
                info: dict[str, Any]) -> PackedRollout:  # fmt: skip
        ids = self._per_token["input_ids"][pos]
        arr = pack_packed(ids.numpy(), lens, pad_to)
        n = len(pos)
        fields = {}
        for name, flat in self._per_token.items():
            if name == "input_ids":
                continue
            row = torch.zeros((1, pad_to, *flat.shape[1:]), dtype=flat.dtype)
            row[0, :n] = flat[pos]
            fields[name] = row
        positions = torch.from_numpy(arr["position_ids"])[None]
        if POSITIONS in fields:  # [1, N], or [1, N, k] of mRoPE: [k, 1, N]
            positions = fields.pop(POSITIONS)
            positions = positions.permute(2, 0, 1) if positions.dim() == 3 else positions
        elif first.any():  # a piece of a split sample: positions go on from its first token
            positions[0, :n] += torch.from_numpy(np.repeat(first, lens))
        return PackedRollout(
            **info, input_ids=torch.from_numpy(arr["input_ids"])[None],
            position_ids=positions.long(),
            labels=torch.from_numpy(arr["labels"])[None],
            cu_seqlens=torch.from_numpy(arr["cu_seqlens"]), max_seqlen=int(arr["max_seqlen"]),
            fields=fields,
        )  # fmt: skip

    def _padded(self, pos: torch.Tensor, lens: np.ndarray, first: np.ndarray, pad_to: int,
                info: dict[str, Any]) -> PaddedRollout:  # fmt: skip
        ids = self._per_token["input_ids"][pos]
        arr = pack_padded(ids.numpy(), lens, pad_to)
        valid = torch.from_numpy(arr["attention_mask"]).bool()
        fields = {}
        for name, flat in self._per_token.items():
            if name == "input_ids":
                continue
            grid = torch.zeros((len(lens), pad_to, *flat.shape[1:]), dtype=flat.dtype)
            grid[valid] = flat[pos]
            fields[name] = grid
        positions = torch.from_numpy(arr["position_ids"])
        if POSITIONS in fields:  # [B, T], or [B, T, k] of mRoPE: [k, B, T]
            positions = fields.pop(POSITIONS)
            positions = positions.permute(2, 0, 1) if positions.dim() == 3 else positions
        elif first.any():
            positions = positions + torch.from_numpy(first)[:, None]
        return PaddedRollout(
            **info, input_ids=torch.from_numpy(arr["input_ids"]), position_ids=positions.long(),
            labels=torch.from_numpy(arr["labels"]),
            attention_mask=torch.from_numpy(arr["attention_mask"]), pad_rows=0, fields=fields,
        )  # fmt: skip

    def restore(self, batches: Sequence[PackedRollout | PaddedRollout],
                outputs: Sequence[torch.Tensor], width: int | None = None) -> torch.Tensor:  # fmt: skip
        """Per-token outputs of ``batches`` (each aligned with its ``input_ids``: ``[1, N]``
        packed, ``[B, T]`` padded) back in the batch's layout, 0 where these batches held no
        token: ``[B, T]`` (``width``: ``None`` or ``T``), or ``[B, W]`` as the ``[B, W]``
        entries hold the response part (``width=rollout.response_width``)."""
        width = restore_width(width, self.width, self.response_width)
        check_outputs(batches, outputs, self.lengths)
        flat_pos, values = [], []
        for batch, out in zip(batches, outputs, strict=True):
            lens = batch.seq_lens.numpy().astype(np.int64)
            first = np.zeros(len(lens), np.int64)
            if batch.sample_offsets is not None:
                first = batch.sample_offsets.numpy()
            idx = batch.sample_ids.numpy()
            flat_pos.append(torch.from_numpy(_ranges(self.starts[idx] + first, lens)))
            if isinstance(batch, PackedRollout):
                values.append(out[0, : int(lens.sum())])
            else:
                values.append(out[batch.attention_mask.bool()])
        pos = torch.cat(flat_pos)
        vals = torch.cat(values)
        grid = torch.zeros((len(self.lengths), self.width, *vals.shape[1:]), dtype=vals.dtype)
        grid[self._rows[pos], self._cols[pos]] = vals
        if width == self.width:
            return grid
        assert self._response_starts is not None  # width is the response part's
        cols = torch.from_numpy(self._response_starts)[:, None] + torch.arange(width)
        out = grid[torch.arange(len(grid))[:, None], cols.clamp(0, self.width - 1)]
        out[(cols < 0) | (cols >= self.width)] = 0
        return out


def token_log_probs(logits: torch.Tensor, batch: PackedBatch | PaddedBatch) -> torch.Tensor:
    """Log-probability of every token given those before it in its sample, aligned with
    ``input_ids`` (logits at ``t`` predict token ``t + 1``); 0 on each sample's first token and
    on padding, which nothing predicts. Computed in float32."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = batch.labels[:, 1:]
    keep = target != IGNORE_INDEX
    got = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep
    return torch.nn.functional.pad(got, (1, 0))


def gather_outputs(part: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The whole batch's outputs on every rank, from each rank's :meth:`Rollout.restore` (each
    entry filled by exactly one rank, 0 elsewhere: their sum is exact)."""
    import torch.distributed as dist

    whole = part.clone()
    dist.all_reduce(whole, op=dist.ReduceOp.SUM, group=group)
    return whole


def gather_lengths(local: Any, group: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, first)``: the lengths of every rank's shard, in rank order, and the index of
    each rank's first sample in them, on every rank (two all-gathers of small tensors)."""
    import torch.distributed as dist

    mine = torch.as_tensor(np.asarray(local, dtype=np.int64))
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(mine)]), group=group)
    most = max(int(s) for s in sizes)
    parts = [torch.zeros(most, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(parts, torch.nn.functional.pad(mine, (0, most - len(mine))), group=group)
    counts = [int(s) for s in sizes]
    lengths = np.concatenate([p[:c].numpy() for p, c in zip(parts, counts, strict=True)])
    return lengths, np.concatenate(([0], np.cumsum(counts)[:-1]))
