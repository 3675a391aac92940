"""``VariableBatchSizeLR``: scale any torch LR schedule by the plan's per-step LR factor.

The plan gives every step a factor from its realised global batch (linear: ``k``, sqrt: ``sqrt(k)``
for a batch ``k`` times the base). The wrapper keeps the base scheduler's own, unscaled LR and sets
the optimizer's LR for step ``s`` to ``base_lr(s) * factor[s]``.

Ordering is the usual one: ``optimizer.step()`` then ``scheduler.step()``. At construction the
optimizer gets step 0's LR; after the ``s``-th ``step()`` call it holds step ``s``'s LR. Chainable
base schedulers (``StepLR``, ``CosineAnnealingLR``'s recursive form, ...) compute the next LR from
the optimizer's current one, so the wrapper puts the unscaled LR back before every base step and
scales again after it: the base schedule never sees a factor, and nothing depends on epoch
arithmetic (the bookkeeping that the blog's wrapper got wrong).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from varpack.errors import InputError
from varpack.planfile.format import Plan, load_plan


class VariableBatchSizeLR:
    """Wrap ``scheduler``; ``factors`` is a plan (dir or :class:`Plan`) or a per-step sequence.

    Past the plan's last step (the ``step()`` after the final optimizer step) the factor is 1.
    """

    def __init__(
        self,
        scheduler: LRScheduler,
        factors: Plan | str | os.PathLike[str] | Sequence[float] | np.ndarray,
    ) -> None:
        if isinstance(factors, (Plan, str, os.PathLike)):
            factors = load_lr_factors(factors)
        self.scheduler = scheduler
        self.factors = np.asarray(factors, dtype=np.float64)
        if (
            self.factors.ndim != 1
            or not np.all(np.isfinite(self.factors))
            or np.any(self.factors <= 0)
        ):
            raise ValueError("LR factors must be a 1-D sequence of positive finite numbers")
        self.last_step = 0
        self._unscaled = [float(g["lr"]) for g in self.optimizer.param_groups]
        self._apply()

    @property
    def optimizer(self) -> Optimizer:
        return self.scheduler.optimizer

    def factor(self, step: int) -> float:
        return float(self.factors[step]) if 0 <= step < len(self.factors) else 1.0

    def _apply(self) -> None:
        f = self.factor(self.last_step)
        for group, lr in zip(self.optimizer.param_groups, self._unscaled, strict=True):
            group["lr"] = lr * f
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def step(self) -> None:
        """Advance one optimizer step: base schedule first (on unscaled LRs), then the factor."""
        for group, lr in zip(self.optimizer.param_groups, self._unscaled, strict=True):
            group["lr"] = lr
        self.scheduler.step()
        self._unscaled = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.last_step += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        """The LRs the optimizer uses now (scaled)."""
        return list(self._last_lr)

    def get_unscaled_lr(self) -> list[float]:
        """The base schedule's LRs for the current step."""
        return list(self._unscaled)

    def state_dict(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler.state_dict(),
            "last_step": self.last_step,
            "unscaled": list(self._unscaled),
            "num_factors": len(self.factors),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore (after the optimizer's own state); the optimizer's LRs are set again."""
        # A replanned run (varpack replan) may have another step count from its step on; a
        # state is refused only when it stands past this plan's steps.
        if int(state.get("last_step", 0)) > len(self.factors):
            raise ValueError(
                f"LR state was saved at step {state.get('last_step')} (of "
                f"{state.get('num_factors')} plan steps), past this plan's {len(self.factors)}"
            )
        self.scheduler.load_state_dict(state["scheduler"])
        self.last_step = int(state["last_step"])
        self._unscaled = self._closed_form() or [float(x) for x in state["unscaled"]]
        self._apply()

    def _closed_form(self) -> list[float] | None:
        """A ``LambdaLR``'s LRs at its restored step, from its own lambdas (what its next
        ``step`` computes too): a resumed run whose schedule was built anew with another length
        (Trainer's ``max_steps``, a re-planned run's steps) follows its new curve from the first
        step, not the saved LR of the old one. The same schedule gives the saved values exactly.
        ``None`` for other schedulers, which keep the saved LRs."""
        base = self.scheduler
        if type(base) is not LambdaLR:
            return None
        return [
            float(lr * f(base.last_epoch))
            for f, lr in zip(base.lr_lambdas, base.base_lrs, strict=True)
        ]


def step_values(steps: np.ndarray, values: np.ndarray, num_steps: int) -> np.ndarray:
    """Per-step value (indexed by step 0..num_steps-1) from per-row columns; checks consistency.

    >>> step_values(np.array([0, 0, 1]), np.array([2.0, 2.0, 0.5]), 2).tolist()
    [2.0, 0.5]
    """
    out = np.full(num_steps, np.nan)
    if len(steps) and (steps.min() < 0 or steps.max() >= num_steps):
        raise InputError(
            f"manifest steps run {steps.min()}..{steps.max()}, plan.json says {num_steps} steps"
        )
    out[steps] = values
    if np.isnan(out).any() or np.any(out[steps] != values):
        raise InputError(
            "the manifest's per-step values are missing or differ within a step; re-run varpack plan"
        )
    return out


def load_lr_factors(plan: Plan | str | os.PathLike[str]) -> np.ndarray:
    """LR factor of every step of a plan (from rank 0's manifest)."""
    plan = plan if isinstance(plan, Plan) else load_plan(plan, verify=False)
    table = plan.rank_table(0).select(["step", "lr_factor"])
    return step_values(
        table.column("step").to_numpy(), table.column("lr_factor").to_numpy(), plan.num_steps
    )
