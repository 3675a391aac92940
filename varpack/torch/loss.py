r"""Exact loss normalisation over a global step, without an all-reduce.

Labels follow :mod:`varpack.torch.batch`: aligned with ``input_ids``, the first token of every
sample and all padding set to ``IGNORE_INDEX``; logits at position ``t`` predict ``labels[t + 1]``.
A sample of ``L`` tokens therefore contributes ``L - 1`` supervised tokens, and a global step
(all ranks, all micro-batches) has ``D = step_tokens - step_samples`` of them; both numbers are in
every manifest row, so every rank knows ``D`` before it computes anything.

The arithmetic. Let rank ``r`` hold token losses :math:`\ell_i` over its micro-batches
:math:`m = 1..K`. Each micro-batch backpropagates

.. math:: \mathcal{L}_{r,m} = \frac{dp}{D} \sum_{i \in (r, m)} \ell_i

so after accumulation rank ``r`` holds :math:`g_r = \frac{dp}{D} \nabla \sum_{i \in r} \ell_i`.
DDP averages gradients over the ``dp`` ranks:

.. math:: \frac{1}{dp} \sum_r g_r = \frac{1}{D} \nabla \sum_{\text{all } i} \ell_i
          = \nabla \Big(\frac{1}{D} \sum_i \ell_i\Big),

the gradient of the mean token loss of the whole step, however the planner split the tokens over
ranks and micro-batches. (Averaging per-micro-batch means instead would weight a token in a short
micro-batch more than one in a long one.) With your own label masking (e.g. prompt tokens ignored)
``D`` is no longer known from the plan: all-reduce the count of supervised tokens instead.

>>> import torch
>>> logits = torch.zeros(1, 4, 3)
>>> labels = torch.tensor([[-100, 1, 2, -100]])
>>> round(float(token_loss_sum(logits, labels)), 4)  # two supervised tokens, log(3) each
2.1972
>>> normaliser(step_tokens=10, step_samples=2, world_size=2)
0.25
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from varpack.torch.batch import IGNORE_INDEX


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy ``[B, T - 1]``: logits at ``t`` against ``labels[t + 1]`` (0 if ignored)."""
    pred = logits[:, :-1, :]
    target = labels[:, 1:]
    loss = F.cross_entropy(
        pred.reshape(-1, pred.shape[-1]).float(),
        target.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return loss.view(target.shape)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the shifted per-token losses of a micro-batch (ignored labels contribute 0)."""
    return token_losses(logits, labels).sum()


def normaliser(step_tokens: int, step_samples: int, world_size: int) -> float:
    """``dp / D`` with ``D = step_tokens - step_samples`` supervised tokens in the step (at least 1)."""
    return world_size / max(step_tokens - step_samples, 1)


def normalise(loss_sum: torch.Tensor, batch: Any, world_size: int) -> torch.Tensor:
    """Scale a micro-batch's summed token loss so that accumulated DDP gradients are exact.

    ``batch`` is any varpack batch (it carries ``step_tokens`` and ``step_samples``).
    """
    return loss_sum * normaliser(batch.step_tokens, batch.step_samples, world_size)
