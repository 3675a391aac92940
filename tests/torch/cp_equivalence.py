"""Run under torchrun (gloo): replay a --cp plan as dp x cp, or its micro-batches whole as dp.

    torchrun --nproc-per-node 4 cp_equivalence.py PLAN TOKENS OUT cp    # dp 2 x cp 2
    torchrun --nproc-per-node 2 cp_equivalence.py PLAN TOKENS OUT dp    # dp 2, no CP

Each optimizer step: every micro-batch's summed token loss times ``world / D`` backpropagated,
gradients summed over the world and divided by it (what DDP does), then SGD. Rank 0 saves each
step's loss and gradients (fp32); every rank saves the (sample id, position) of each token it
computed, to check that each token is seen exactly once across a CP group.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from varpack.torch import ParquetTokenDataset, PlanLoader, token_loss_sum
from varpack.torch.cp import CPBatch, cp_group, cp_inputs
from varpack.torch.cp import token_loss_sum as cp_loss_sum
from varpack.torch.model import PRESETS, TinyGPT, model_inputs


def main() -> None:
    plan, tokens, out, mode = sys.argv[1:5]
    dist.init_process_group("gloo")
    world, g = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = TinyGPT(PRESETS["tiny"])
    ds = ParquetTokenDataset(tokens)
    loader = PlanLoader(plan, ds) if mode == "cp" else PlanLoader(plan, ds, cp_size=1)
    group = cp_group(2) if mode == "cp" else None
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads, seen = [], [], []
    step_loss = torch.zeros(())
    for batch in loader:
        d = max(batch.step_tokens - batch.step_samples, 1)
        if isinstance(batch, CPBatch):
            logits = model(**cp_inputs(batch, group))
            loss = cp_loss_sum(logits, batch)
            sid = torch.repeat_interleave(
                torch.from_numpy(batch.sample_ids), torch.from_numpy(batch.seq_lens)
            )
            # positions of this rank's tokens, by sample: position_ids within their sample
            order = torch.from_numpy(batch.placement)
            seen.append({"step": batch.step, "micro": batch.micro,
                         "pos": batch.position_ids[0].tolist(), "ids": batch.input_ids[0].tolist(),
                         "placement": order.tolist(), "total": int(sid.numel())})  # fmt: skip
        else:
            logits = model(**model_inputs(batch, "mask"))
            loss = token_loss_sum(logits, batch.labels)
        (loss * world / d).backward()
        step_loss += loss.detach() / d
        if batch.is_last_micro:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            dist.all_reduce(step_loss)
            losses.append(float(step_loss))
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
            opt.step()
            opt.zero_grad(set_to_none=False)
            step_loss = torch.zeros(())
    Path(out).mkdir(parents=True, exist_ok=True)
    if g == 0:
        torch.save({"losses": losses, "grads": grads}, Path(out) / f"{mode}.pt")
    (Path(out) / f"seen-{mode}-{g}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
