"""jobs/rl_loop.py on 2 gloo processes (started as torchrun starts them, forked from a process
that imported it: ``plan_helpers.ranks``): DDP and FSDP2 train the same batches, with plans,
coverage and log-probs verified every iteration, to the same loss."""

from __future__ import annotations

import re
import sys

import pytest

pytest.importorskip("torch.distributed.fsdp")

from rollout_helpers import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "torch"))  # plan_helpers
from plan_helpers import ranks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def test_the_rl_loop_runs_under_ddp_and_fsdp() -> None:
    out = ranks(2, ROOT / "jobs" / "rl_loop.py", "--strategy", "ddp", "fsdp", "--verify").stdout
    for strategy, sync in (("ddp", "step"), ("fsdp", "micro")):
        lines = re.findall(rf"\[rl\] {strategy} iteration \d: .*\({sync} sync\); loss (.*);", out)
        assert len(lines) == 2, out  # each iteration planned for the strategy's sync model
        assert (
            f"[rl] {strategy} done: 2 iterations, parameters the same on every rank, verified"
            in out
        )
    first = re.search(r"first step's loss: ddp (\S+) vs fsdp (\S+)", out)
    assert first, out  # the loss normalised by the plan's step totals: the same however split
    assert abs(float(first.group(1)) - float(first.group(2))) < 1e-6
