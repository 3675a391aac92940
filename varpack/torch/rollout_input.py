"""A rollout batch's entries read and checked for :class:`~varpack.torch.rollout.Rollout`.

Each entry of the dict is a tensor or a sequence, and which one decides what it holds:

* a tensor ``[B, T, ...]`` (``T``: the width of ``input_ids``) or ``[B, W, ...]`` with ``W < T``:
  one value per token (``"token"``);
* a tensor ``[B]``, or a list, tuple or NumPy array of ``B`` entries: one value per sample
  (``"sample"``).

Anything else (a number, ``None``, a 0-d tensor, a string, a tensor of another batch size) is one
:class:`~varpack.errors.InputError` naming the entry. So are values no entry of that name holds:
token ids and positions (:data:`INTEGER`) of a float or boolean dtype (a float id would be cut to
another id), and masks (the attention mask, the response mask) that are neither boolean nor
integers 0 and 1.

A plan given to ``micro_batches`` must be of the batch (:func:`check_plan`), and what ``restore``
takes its micro-batches with an output each (:func:`check_outputs`). Imports: torch, NumPy,
:mod:`varpack.errors`, :mod:`varpack.online` (the plan's type), :mod:`varpack.torch.batch`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from varpack.errors import ConfigError, InputError
from varpack.online import BatchPlan
from varpack.torch.batch import PackedBatch, PaddedBatch

#: entries that hold token ids or positions, integers
INTEGER = ("input_ids", "responses", "prompts", "position_ids")


def _integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def check_integers(name: str, value: torch.Tensor) -> None:
    """Token ids or positions: an integer dtype, else one line."""
    if not _integer(value.dtype):
        raise InputError(
            f"{name}: {value.dtype}, but it holds token ids or positions, integers (a "
            f"fraction would be cut to another id): give an integer tensor ({name}.long())"
        )


def check_mask(name: str, value: torch.Tensor) -> None:
    """A mask: boolean, or integers that are 0 or 1, else one line naming the first entry."""
    if value.dtype == torch.bool:
        return
    if not _integer(value.dtype):
        raise InputError(
            f"{name}: {value.dtype}, but a mask is boolean or integers 0 and 1: give "
            f"{name}.bool() (or .long()) of a mask that holds only 0 and 1"
        )
    bad = (value != 0) & (value != 1)
    if bool(bad.any()):
        at = tuple(int(i) for i in bad.nonzero()[0])
        raise InputError(
            f"{name}{list(at)} = {int(value[at])}: a mask holds 0 or 1 (1 on the tokens it marks)"
        )


def _what(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a NumPy array of shape {value.shape}"
    return "None" if value is None else f"a {type(value).__name__}"


def _sequence(value: Any) -> bool:
    """A list, a tuple, a 1-D tensor, or a NumPy array of at least one dimension."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 1
    return isinstance(value, list | tuple) or (isinstance(value, np.ndarray) and value.ndim >= 1)


def entry_kind(name: str, value: Any, b: int) -> str:
    """``"token"`` or ``"sample"`` (see the module doc) for the entry ``name`` of a batch of
    ``b`` samples; one line for anything else."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == b:
        return "token"
    if _sequence(value):
        if len(value) == b:
            return "sample"
        raise InputError(f"{name}: {len(value)} entries for a batch of {b} samples")
    raise InputError(
        f"{name}: {_what(value)} for a batch of {b} samples; give a tensor [{b}, T] or "
        f"[{b}, W] (one value per token), or a tensor [{b}], a list or a NumPy array of {b} "
        "entries (one per sample)"
    )


def batch_tensor(name: str, value: Any) -> torch.Tensor:
    """``input_ids`` or the attention mask: a ``[batch, length]`` tensor, else one line."""
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        raise InputError(f"{name}: a [batch, length] tensor, not {_what(value)}")
    return value


def plan_index(name: str, value: Any, count: int, what: str) -> int:
    """``value`` as one of the ``count`` steps or ranks of a plan (``0 .. count - 1``: no
    negative index from the end), else one line."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value < count:
        raise ConfigError(f"{name}={value!r} is not one of the plan's {what} 0..{count - 1}")
    return int(value)


def check_plan(plan: Any, lengths: np.ndarray) -> None:
    """``plan`` (a :class:`~varpack.online.BatchPlan`) is of the rollout of ``lengths``: as many
    samples, each of the same tokens (its pieces' sum, split), and no more loss tokens than
    tokens; else one line naming the first sample that differs (NumPy over the plan's units)."""
    if not isinstance(plan, BatchPlan):
        raise InputError(f"plan: a BatchPlan of this rollout (plan_batch(rollout.lengths, "
                         f"...)), not {type(plan).__name__}")  # fmt: skip
    p, n = plan.arrays, len(lengths)
    held = int(p.ids.max()) + 1 if len(p.ids) else 0
    again = "plan this rollout's own lengths: plan_batch(rollout.lengths, ...)"
    if held != n:
        raise InputError(f"the plan is of a batch of {held} samples, this rollout holds "
                         f"{n}: {again}")  # fmt: skip
    tokens = np.bincount(p.ids, weights=p.lens, minlength=n).astype(np.int64)
    bad = np.flatnonzero(tokens != lengths)
    if len(bad):
        i = int(bad[0])
        raise InputError(f"sample {i} has {int(lengths[i])} tokens in this rollout but "
                         f"{int(tokens[i])} in the plan, which is of another batch: "
                         f"{again}")  # fmt: skip
    if plan.loss_tokens is not None:
        over = np.flatnonzero(plan.loss_tokens > lengths)
        if len(over):
            i = int(over[0])
            raise InputError(f"the plan's loss_tokens[{i}] = {int(plan.loss_tokens[i])} is "
                             f"more than sample {i}'s {int(lengths[i])} tokens: give "
                             "plan_batch the tokens each sample's loss counts, "
                             "loss_tokens=rollout.loss_tokens()")  # fmt: skip


def position_entry(value: torch.Tensor, t: int) -> torch.Tensor:
    """``position_ids`` ``[B, T]``, or ``[B, k, T]`` (mRoPE: ``k`` streams) as ``[B, T, k]``, one
    row of ``k`` positions a token; any other shape is one line."""
    if value.dim() == 2 and value.shape[1] == t:
        return value
    if value.dim() == 3 and value.shape[2] == t:
        return value.transpose(1, 2)
    b = value.shape[0]
    raise InputError(f"position_ids: {tuple(value.shape)}, not [{b}, {t}] (one position a token) "
                     f"or [{b}, k, {t}] (mRoPE: k positions a token)")  # fmt: skip


def restore_width(width: Any, t: int, w: int | None) -> int:
    """``restore``'s ``width``: ``None`` (``t``), ``t``, or ``w`` (the response part's)."""
    if width is None:
        return t
    if not isinstance(width, bool) and isinstance(width, int | np.integer) and width in (t, w):
        return int(width)
    part = f" or {w} (the response part, as the [B, {w}] entries)" if w is not None else ""
    raise ConfigError(f"width={width!r}: {t} (the batch's columns, the default){part}")


def check_outputs(batches: Any, outputs: Any, lengths: np.ndarray) -> None:
    """``restore``'s micro-batches (this rollout's) and their outputs, one a batch, each
    aligned with its batch's ``input_ids`` and all of one shape per token; else one line."""
    if not isinstance(batches, list | tuple) or not isinstance(outputs, list | tuple):
        raise InputError("restore: batches and outputs are lists (a micro-batch's output each)")
    if not batches or len(batches) != len(outputs):
        raise InputError(f"restore: {len(batches)} micro-batches and {len(outputs)} outputs; "
                         "give at least one micro-batch and one output for each")  # fmt: skip
    rest = None
    for j, (batch, out) in enumerate(zip(batches, outputs, strict=True)):
        if not isinstance(batch, PackedBatch | PaddedBatch):
            raise InputError(f"restore: batches[{j}] is {_what(batch)}, not a micro-batch of "
                             "rollout.micro_batches")  # fmt: skip
        idx, lens = batch.sample_ids.numpy(), batch.seq_lens.numpy().astype(np.int64)
        first = np.zeros(len(idx), np.int64) if batch.sample_offsets is None else (
            batch.sample_offsets.numpy()
        )  # fmt: skip
        if ((idx < 0) | (idx >= len(lengths))).any() or (
            first + lens > lengths[np.clip(idx, 0, len(lengths) - 1)]
        ).any():
            raise InputError(f"restore: batches[{j}] holds samples this rollout does not (of "
                             f"its {len(lengths)}): give this rollout's micro_batches")  # fmt: skip
        want = tuple(batch.input_ids.shape)
        if not isinstance(out, torch.Tensor) or tuple(out.shape[:2]) != want:
            raise InputError(f"restore: outputs[{j}] is {_what(out)}, but batches[{j}] holds "
                             f"input_ids {list(want)}: one output per token, aligned with "
                             "them")  # fmt: skip
        rest = tuple(out.shape[2:]) if rest is None else rest
        if tuple(out.shape[2:]) != rest:
            raise InputError(f"restore: outputs[{j}] holds {list(out.shape[2:])} values a "
                             f"token, outputs[0] {list(rest)}: one shape for all")  # fmt: skip


__all__ = [
    "INTEGER",
    "batch_tensor",
    "check_integers",
    "check_mask",
    "check_plan",
    "entry_kind",
    "plan_index",
]
