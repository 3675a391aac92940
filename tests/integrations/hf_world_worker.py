"""One rank of test_hf_world.py's torchrun test (CPU, no GPU): ``VarpackTrainer`` with the
README's arguments exactly (no ``use_cpu``) and a ``PlanLoader`` made without ``rank=``, for two
steps of the dp 2 plan; then, in the same process group, the set-ups that must be refused before
training. Each rank saves what it saw to ``OUT/rank{R}.pt``.

    torchrun --nproc-per-node 2 tests/integrations/hf_world_worker.py PLAN_DP2 PLAN_DP1 TOKENS OUT
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def refused(make: Callable[[], Any]) -> tuple[str, str] | None:
    """(error class, message) of the varpack error ``make`` raised; ``None`` if it raised none."""
    from varpack.errors import VarpackError

    try:
        make()
    except VarpackError as exc:
        return type(exc).__name__, str(exc)
    return None


def main(plan: Path, plan_dp1: Path, tokens: Path, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from hf_helpers import readme_args, readme_llama, trainer_losses

    from varpack.integrations.hf import VarpackTrainer
    from varpack.integrations.loss import unwrapped
    from varpack.torch import ParquetTokenDataset, PlanLoader

    data = ParquetTokenDataset(tokens)
    loader = PlanLoader(plan, data)  # the README's, without rank=
    model = readme_llama()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    args = readme_args(out / "hf-run", max_steps=2)
    trainer = VarpackTrainer(model, args, plan_loader=loader)
    trainer.train()
    result: dict[str, Any] = {
        "rank": loader.rank,
        "trainer": (args.world_size, args.process_index, args.use_cpu),
        "wrapped": type(trainer.model_wrapped).__name__,
        "losses": trainer_losses(trainer),
        "initial": initial,
        "weights": {
            k: v.detach().clone() for k, v in unwrapped(trainer.model).state_dict().items()
        },
    }
    result["refused"] = {
        # a loader told to read rank 0 on both processes: only rank 1 is wrong, both refuse
        "loader_rank0": refused(lambda: VarpackTrainer(
            readme_llama(), readme_args(out / "rank0"), plan_loader=PlanLoader(plan, data, rank=0)
        )),
        "small_vocab": refused(lambda: VarpackTrainer(
            readme_llama(vocab_size=64), readme_args(out / "vocab"), plan_loader=PlanLoader(plan, data)
        )),
        "dp1_plan": refused(lambda: PlanLoader(plan_dp1, data)),
    }  # fmt: skip
    torch.save(result, out / f"rank{loader.rank}.pt")
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's teardown at interpreter exit can deadlock (see jobs/train.py)


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:5]))
