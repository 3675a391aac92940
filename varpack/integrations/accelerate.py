"""A plain ``accelerate`` loop on a varpack plan: ``accelerate`` wraps the model, never the data.

``accelerator.prepare(model, optimizer)`` only: a prepared DataLoader would be sharded or
dispatched across processes, but each rank already reads its own rank of the plan. Gradient
accumulation is the plan's too: :func:`micro_step` runs one micro-batch's forward and backward
under :func:`accumulate`, which skips DDP's all-reduce (``accelerator.no_sync``) on every
micro-batch but the step's last (``batch.is_last_micro``) and sets ``accelerator.sync_gradients``
to match, as ``accelerator.accumulate`` would for a fixed count. The loss is
:func:`~varpack.integrations.loss.plan_loss` (exact token mean of the global step after DDP's
average), so ``Accelerator(gradient_accumulation_steps=...)`` must stay 1::

    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader
    check_sync(accelerator, loader, model)  # a plan balanced for another sync: one line
    scheduler = VariableBatchSizeLR(base_scheduler, loader.lr_factors())
    for batch in loader:  # this rank's micro-batches
        loss = micro_step(accelerator, model, batch.to(accelerator.device), loader.world_size)
        if batch.is_last_micro:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

The values :func:`micro_step` returns, summed over a step on one rank and averaged over ranks
(``accelerator.reduce(total, "mean")``), are the step's token-mean loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from varpack.errors import ConfigError
from varpack.integrations.loss import LossFn, plan_loss
from varpack.integrations.sync import check_sync


@contextlib.contextmanager
def accumulate(accelerator: Accelerator, model: nn.Module, batch: Any) -> Iterator[None]:
    """Gradients all-reduced only on the plan's last micro-batch of a step (``no_sync`` before
    it); ``accelerator.sync_gradients`` is ``batch.is_last_micro`` inside."""
    if accelerator.gradient_accumulation_steps != 1:
        raise ConfigError(
            f"Accelerator(gradient_accumulation_steps={accelerator.gradient_accumulation_steps}): "
            "the plan accumulates (batch.is_last_micro) and plan_loss normalises over the step; "
            "leave it at 1"
        )
    # what accelerator.accumulate() sets for a fixed count; here from the plan
    accelerator.gradient_state._set_sync_gradients(bool(batch.is_last_micro))
    if batch.is_last_micro:
        yield
    else:
        with accelerator.no_sync(model):
            yield


def micro_step(
    accelerator: Accelerator,
    model: nn.Module,
    batch: Any,
    world_size: int,
    loss_fn: LossFn | None = None,
    attn_implementation: str | None = None,
) -> torch.Tensor:
    """Forward and backward of one micro-batch (on the model's device) under :func:`accumulate`;
    returns the detached loss (:func:`~varpack.integrations.loss.plan_loss`).

    ``world_size``: the plan's dp (``loader.world_size``), which under DDP must be the
    accelerator's number of processes.
    """
    if accelerator.num_processes > 1 and accelerator.num_processes != world_size:
        raise ConfigError(
            f"{accelerator.num_processes} processes, but world_size={world_size}: pass "
            "loader.world_size (the plan's dp) and launch that many processes"
        )
    with accumulate(accelerator, model, batch):
        loss = plan_loss(model, batch, world_size, loss_fn, attn_implementation)
        accelerator.backward(loss)
    return loss.detach()


__all__ = ["accumulate", "check_sync", "micro_step"]
