"""VariableBatchSizeLR: the LR of every step is base schedule x factor, also after a resume."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from plan_helpers import make_plan, random_lengths  # noqa: E402
from torch.optim import lr_scheduler as S  # noqa: E402

from varpack.torch import PlanLoader, VariableBatchSizeLR, load_lr_factors  # noqa: E402

SCHEDULES = {
    "step": lambda o: S.StepLR(o, step_size=3, gamma=0.5),  # chainable: reads the optimizer's LR
    "cosine": lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=1e-5),  # recursive form
    "lambda": lambda o: S.LambdaLR(o, lambda s: min(1.0, (s + 1) / 4)),  # closed form, warm-up
    "onecycle": lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=40),
}


def _optimizer() -> torch.optim.Optimizer:
    p1, p2 = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    return torch.optim.SGD([{"params": [p1]}, {"params": [p2], "lr": 0.3}], lr=0.1, momentum=0.9)


def _base_lrs(name: str, steps: int) -> list[list[float]]:
    opt = _optimizer()
    sched = SCHEDULES[name](opt)
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_lr_is_base_times_factor_at_every_step_and_after_resume(name) -> None:
    factors = np.array([5.0, 2.0, 0.5, 1.0, 3.0, 0.25, 1.5, 4.0, 1.0, 2.5, 0.75, 1.25])
    base = _base_lrs(name, len(factors))
    opt = _optimizer()
    lr = VariableBatchSizeLR(SCHEDULES[name](opt), factors)
    seen = []
    for s in range(len(factors)):
        seen.append([g["lr"] for g in opt.param_groups])
        if s == 6:  # checkpoint after step 5's update, restore into fresh objects
            state_opt, state_lr = opt.state_dict(), lr.state_dict()
            opt = _optimizer()
            lr = VariableBatchSizeLR(SCHEDULES[name](opt), factors)
            opt.load_state_dict(state_opt)
            lr.load_state_dict(state_lr)
            assert [g["lr"] for g in opt.param_groups] == seen[-1]
        opt.step()
        lr.step()
    for s, (got, want) in enumerate(zip(seen, base, strict=True)):
        assert np.allclose(got, np.array(want) * factors[s], rtol=1e-12, atol=0), (s, got, want)
    assert lr.get_last_lr() == [g["lr"] for g in opt.param_groups]  # past the end: factor 1
    assert np.allclose(lr.get_last_lr(), lr.get_unscaled_lr())


def test_a_lambda_schedule_built_anew_is_followed_from_the_resumed_step() -> None:
    """A run resumed with a longer schedule (Trainer's larger max_steps) takes the new curve's LR
    at the restored step, not the saved one of the old curve (0 at the old end)."""
    factors = np.array([1.0, 2.0, 0.5, 4.0, 1.5, 3.0])

    def decay(total: int) -> Callable[[int], float]:
        return lambda s: max(0.0, 1 - s / total)

    opt = _optimizer()
    lr = VariableBatchSizeLR(S.LambdaLR(opt, decay(3)), factors)
    for _ in range(3):
        opt.step()
        lr.step()
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]  # the 3-step curve's end
    state_opt, state_lr = opt.state_dict(), lr.state_dict()
    opt = _optimizer()
    lr = VariableBatchSizeLR(S.LambdaLR(opt, decay(6)), factors)
    opt.load_state_dict(state_opt)
    lr.load_state_dict(state_lr)
    for s in (3, 4):
        want = [0.1 * (1 - s / 6) * factors[s], 0.3 * (1 - s / 6) * factors[s]]
        assert np.allclose([g["lr"] for g in opt.param_groups], want, rtol=1e-12, atol=0), s
        opt.step()
        lr.step()


def test_factors_from_a_plan(tmp_path, rng) -> None:
    lens = random_lengths(rng, 40)
    plan = make_plan(tmp_path / "p", lens, dp=2, grad_accum=2, budget=50, base_batch=4)
    factors = load_lr_factors(plan)
    table = PlanLoader(plan, {}, rank=1).plan.rank_table(1).to_pylist()
    for row in table:
        assert factors[row["step"]] == row["step_samples"] / 4
    opt = _optimizer()
    lr = VariableBatchSizeLR(S.LambdaLR(opt, lambda s: 1.0), plan)
    assert np.isclose(opt.param_groups[0]["lr"], 0.1 * factors[0])
    with pytest.raises(ValueError, match="positive"):
        VariableBatchSizeLR(S.LambdaLR(_optimizer(), lambda s: 1.0), [1.0, 0.0])
    with pytest.raises(ValueError, match="past this plan's"):
        lr.load_state_dict({**lr.state_dict(), "last_step": len(factors) + 1})
