"""One rank of test_hf_trainer.py's DDP test (torchrun, gloo on the CPU): on the same plan,
``VarpackTrainer`` and then the plain ``accelerate`` loop (``micro_step``), each from the same
seeded TinyGPT with jobs/train.py's recipe. Rank 0 saves each one's per-step losses and final
weights to ``OUT/ddp.pt``.

    torchrun --nproc-per-node 2 tests/integrations/hf_ddp_worker.py PLAN TOKENS OUT
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from hf_helpers import by_step, gpt_loss, tiny_gpt, train_py_recipe, trainer_losses
from transformers import TrainingArguments

from varpack.integrations.accelerate import micro_step
from varpack.integrations.hf import VarpackTrainer
from varpack.integrations.loss import unwrapped
from varpack.torch import ParquetTokenDataset, PlanLoader, VariableBatchSizeLR


def main(plan: Path, tokens: Path, out: Path) -> None:
    dataset = ParquetTokenDataset(tokens)
    loader = PlanLoader(plan, dataset)  # rank and world size from torchrun
    model = tiny_gpt()
    opt, base = train_py_recipe(model, loader.num_steps)
    args = TrainingArguments(
        output_dir=str(out / "trainer"), logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True,
    )  # fmt: skip
    trainer = VarpackTrainer(
        model, args, plan_loader=loader, loss_fn=gpt_loss, optimizers=(opt, base)
    )
    trainer.train()
    result = {
        "rank": loader.rank,
        "world": dist.get_world_size(),
        "trainer_losses": trainer_losses(trainer),
        "trainer_weights": unwrapped(trainer.model).state_dict(),
    }

    accelerator = Accelerator(cpu=True)
    loader = PlanLoader(plan, dataset)
    model = tiny_gpt()
    opt, base = train_py_recipe(model, loader.num_steps)
    sched = VariableBatchSizeLR(base, loader.lr_factors())
    ddp_model, opt = accelerator.prepare(model, opt)  # not the loader: each rank reads its own
    losses = []
    for step in by_step(loader):
        total = torch.zeros(())
        for batch in step:
            total += micro_step(accelerator, ddp_model, batch, loader.world_size, gpt_loss)
        accelerator.clip_grad_norm_(ddp_model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(accelerator.reduce(total, reduction="mean")))
    result["accelerate_losses"] = losses
    result["accelerate_weights"] = model.state_dict()
    result["accelerate_type"] = type(ddp_model).__name__
    if loader.rank == 0:
        torch.save(result, out / "ddp.pt")
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's teardown at interpreter exit can deadlock (see jobs/train.py)


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))
