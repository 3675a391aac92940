"""One rank of test_hf_sync.py's torchrun test (CPU, gloo): the plan's sync held to what runs.

- ``Accelerator()`` (no ``cpu=True``): accelerate sets itself up as one process in a job of two;
  ``check_sync`` with its unwrapped model must refuse, on every rank;
- ``Accelerator(cpu=True)``: DDP over gloo; a ``--sync step`` plan is its own, nothing said;
- ``VarpackTrainer`` with ``TrainingArguments(fsdp="full_shard")``: accelerate runs DDP on the
  CPU; a warning on rank 0 says so.

Each rank writes what it saw to ``OUT/rank{R}.json``.

    torchrun --nproc-per-node 2 tests/integrations/hf_sync_worker.py PLAN_STEP PLAN_DP2 TOKENS OUT
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any


def main(step_plan: Path, micro_plan: Path, tokens: Path, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from hf_helpers import gpt_loss, tiny_gpt
    from transformers import TrainingArguments

    from varpack.errors import VarpackError
    from varpack.integrations.hf import VarpackTrainer
    from varpack.integrations.sync import check_sync, running
    from varpack.torch import ParquetTokenDataset, PlanLoader

    data = ParquetTokenDataset(tokens)
    rank = int(os.environ["RANK"])
    seen: dict[str, Any] = {}
    accelerator = Accelerator()  # on the CPU without cpu=True: one process of its own
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    try:
        check_sync(accelerator, PlanLoader(step_plan, data), model)
        seen["plain"] = None
    except VarpackError as exc:
        seen["plain"] = [type(exc).__name__, str(exc)]
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True)  # DDP over gloo
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        advice = check_sync(accelerator, PlanLoader(step_plan, data), model)
    seen["cpu"] = {"strategy": list(running(accelerator.state, model)),
                   "advice": advice, "warned": [str(w.message) for w in caught]}  # fmt: skip
    AcceleratorState._reset_state(True)
    args = TrainingArguments(str(out / "run"), report_to="none", disable_tqdm=True,
                             fsdp="full_shard")  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        VarpackTrainer(tiny_gpt(), args, plan_loader=PlanLoader(micro_plan, data),
                       loss_fn=gpt_loss)  # fmt: skip
    seen["trainer"] = [f"{w.category.__name__}: {w.message}" for w in caught
                       if w.category.__name__ in ("StrategyWarning", "PlanSyncWarning")]  # fmt: skip
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's teardown at interpreter exit can deadlock (see jobs/train.py)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # hf_helpers
    main(*map(Path, sys.argv[1:5]))
