"""The loss a framework backpropagates for one varpack micro-batch: exact over the global step.

A plan knows ``D = batch.label_tokens``, the supervised tokens of the whole global step (every
rank, every micro-batch), before anything runs. Each micro-batch backpropagates its summed token
loss times ``world_size / D``; DDP averages the accumulated gradients over ``world_size`` ranks,
which leaves exactly the gradient of the step's token-mean loss (:mod:`varpack.torch.loss` has the
arithmetic). This is also what ``transformers.Trainer`` itself computes when it is given the
global item count: the model divides by ``num_items_in_batch`` and ``compute_loss`` multiplies by
the number of processes (``average_tokens_across_devices``) to undo DDP's mean.

Two ways to get the summed token loss:

- a Hugging Face causal LM (anything with ``config._attn_implementation``): the model's own loss
  with ``labels`` and ``num_items_in_batch=D`` on :func:`~varpack.torch.hf.hf_inputs`, which keeps
  packed samples apart for the model's attention implementation, times ``world_size``;
- any other module: ``loss_fn(model, batch)`` returns the micro-batch's *summed* token loss (e.g.
  :func:`~varpack.torch.loss.token_loss_sum` of its logits) and :func:`~varpack.torch.loss.normalise`
  scales it, exactly as ``jobs/train.py`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from varpack.errors import ConfigError
from varpack.torch.hf import hf_inputs
from varpack.torch.loss import normalise

#: ``loss_fn(model, batch) -> summed token loss`` of one micro-batch (not normalised)
LossFn = Callable[[nn.Module, Any], torch.Tensor]


def unwrapped(model: nn.Module) -> nn.Module:
    """The module inside DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def attn_implementation_of(model: nn.Module) -> str:
    """``model.config._attn_implementation`` of a ``transformers`` model (through wrappers)."""
    impl = getattr(getattr(unwrapped(model), "config", None), "_attn_implementation", None)
    if not isinstance(impl, str):
        raise ConfigError(
            f"{type(unwrapped(model)).__name__} has no config._attn_implementation: give "
            "attn_implementation= (a transformers model), or loss_fn=(model, batch) -> summed "
            "token loss (any other module)"
        )
    return impl


def plan_loss(
    model: nn.Module,
    batch: Any,
    world_size: int,
    loss_fn: LossFn | None = None,
    attn_implementation: str | None = None,
) -> torch.Tensor:
    """This micro-batch's loss to backpropagate: its share of the step's token-mean loss, times
    ``world_size`` (the plan's dp, DDP's world) to undo DDP's gradient average.

    Summed over a step's micro-batches and averaged over ranks, the returned values give the
    step's mean token loss. ``loss_fn``: see :data:`LossFn`; without it ``model`` must be a
    ``transformers`` causal LM (``attn_implementation`` defaults to the model's own).
    """
    if loss_fn is not None:
        return normalise(loss_fn(model, batch), batch, world_size)
    attn = attn_implementation or attn_implementation_of(model)
    dtype = getattr(unwrapped(model), "dtype", torch.float32)  # the additive mask's, for eager
    inputs = hf_inputs(batch, attn, dtype=dtype, labels=True)
    out = model(**inputs, num_items_in_batch=batch.label_tokens)
    return out.loss * world_size


__all__ = ["LossFn", "attn_implementation_of", "plan_loss", "unwrapped"]
