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

Imports: torch, NumPy, :mod:`varpack.errors`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from varpack.errors import ConfigError, InputError

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


__all__ = ["INTEGER", "batch_tensor", "check_integers", "check_mask", "entry_kind", "plan_index"]
