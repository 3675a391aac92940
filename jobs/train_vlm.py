"""Example trainer for vision-language data: replay a varpack plan into a Qwen2-VL with DDP.

    torchrun --standalone --nproc-per-node 2 jobs/train_vlm.py --plan PLAN --data DATA --out RUN

``DATA`` is what ``jobs/vlm_demo_data.py`` wrote: the tokenized dataset and the model's
config.json. Each rank reads its own micro-batches of the plan with ``PlanLoader(...,
vision=config)``. The dataset makes a sample the way a real pipeline does in its DataLoader
workers: its images (drawn again from their seeds) through Qwen2-VL's image processor, beside
its tokens, and labels with the image placeholders left out; the loader packs each micro-batch
into one row (``VisionBatch``: multimodal RoPE positions, token types, pixels) and ``hf_inputs``
gives it to the model with the attention kept inside each sample. The loss of a
micro-batch is its token losses over the step's supervised tokens on every rank
(``num_items_in_batch``), times the world size (DDP averages gradients), so the accumulated
gradient is the step's mean token loss; DDP meets once a step (``no_sync`` on the others).
``--fsdp`` shards the model with FSDP2 (``fully_shard`` on every block, then the whole) and
reduce-scatters once a step: the same losses as DDP. Writes ``RUN/metrics.jsonl`` (rank 0:
step, loss, images in rank 0's micro-batches).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from varpack.atomic import check_apart
from varpack.errors import InputError, OutputError, VarpackError
from varpack.planfile.format import load_plan
from varpack.torch.hf import hf_inputs
from varpack.torch.loader import PlanLoader
from varpack.torch.vlm import IGNORE_INDEX, VisionBatch


class Samples:
    """The demo's samples by id, as a DataLoader worker would make them."""

    def __init__(self, data: Path, config: dict[str, Any]) -> None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        table = pq.read_table(data / "tokens")
        self.rows = {int(s): i for i, s in enumerate(table.column("sample_id").to_pylist())}
        self.table = table.to_pydict()
        self.processor = Qwen2VLImageProcessorPil(**config["varpack_processor"])
        self.image_token = config["image_token_id"]

    def __getitem__(self, sample_id: int) -> dict[str, Any]:
        i = self.rows[sample_id]
        ids = torch.tensor(self.table["input_ids"][i])
        types = (ids == self.image_token).to(torch.int64)
        labels = ids.masked_fill(types.bool(), IGNORE_INDEX)
        out: dict[str, Any] = {"input_ids": ids, "mm_token_type_ids": types, "labels": labels}
        sizes, seeds = self.table["image_sizes"][i], self.table["image_seeds"][i]
        if sizes:
            images = [np.random.default_rng(s).integers(0, 256, (h, w, 3), dtype=np.uint8)
                      for (h, w), s in zip(sizes, seeds, strict=True)]  # fmt: skip
            got = self.processor(images=images, return_tensors="pt",
                                 input_data_format="channels_last")  # fmt: skip
            out["pixel_values"], out["image_grid_thw"] = got["pixel_values"], got["image_grid_thw"]
            want = torch.tensor(self.table["image_grid_thw"][i])
            assert torch.equal(got["image_grid_thw"], want), (sample_id, got["image_grid_thw"])
        return out


def _steps(loader: PlanLoader, most: int) -> Iterator[list[VisionBatch]]:
    """The loader's micro-batches, a step's at a time (its first ``most`` steps)."""
    held: list[VisionBatch] = []
    for batch in loader:
        held.append(batch)
        if batch.is_last_micro:
            yield held
            held, most = [], most - 1
            if most == 0:
                return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds a collective may wait")
    ap.add_argument(
        "--fsdp",
        action="store_true",
        help="shard with FSDP2 (fully_shard: every block, then the model) instead of DDP",
    )
    args = ap.parse_args(argv)
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    try:  # the inputs checked before any rank waits for another: one line, exit 2
        check_apart(args.out, (args.plan, args.data))
        if (args.out / "metrics.jsonl").exists():
            raise OutputError(f"{args.out} holds a run's metrics.jsonl; give another --out")
        plan = load_plan(args.plan, verify=True)
        config_file = args.data / "model" / "config.json"
        if not config_file.is_file() or not (args.data / "tokens").is_dir():
            raise InputError(f"--data {args.data}: no model/config.json or tokens/; give the "
                             "output of jobs/vlm_demo_data.py")  # fmt: skip
    except VarpackError as exc:
        print(f"train_vlm: error: {exc}", file=sys.stderr)
        return 2
    # a rank that stops answering fails the collectives after this, rather than hanging them
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if plan.dp != world:
        raise SystemExit(f"train_vlm: the plan is for {plan.dp} ranks, this run has {world}")
    config_doc = json.loads(config_file.read_text())
    config = Qwen2VLConfig.from_dict(config_doc)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = Qwen2VLForConditionalGeneration._from_config(config, attn_implementation="sdpa",
                                                          dtype=torch.float32)  # fmt: skip
    if args.fsdp:  # FSDP2: parameters gathered at every micro-batch, gradients reduce-scattered
        from torch.distributed.fsdp import fully_shard

        # the model's output holds views; this loop does no in-place op on them
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        for block in (*model.model.visual.blocks, *model.model.language_model.layers):
            fully_shard(block)
        ddp = fully_shard(model)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    data = Samples(args.data, config_doc)
    # each micro-batch made by the reader: the samples through the processor, packed
    loader = PlanLoader(args.plan, data, rank=rank, world_size=world, vision=config)
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "metrics.jsonl").open("w") if rank == 0 else None
    for packed in _steps(loader, args.max_steps):
        step = packed[0].step
        items = torch.tensor([sum(b.micro_label_tokens for b in packed)])
        dist.all_reduce(items)  # the step's supervised tokens, every rank
        loss_sum = torch.zeros(1)
        for j, batch in enumerate(packed):
            kw = hf_inputs(batch, "sdpa", labels=True)
            last = j == len(packed) - 1
            if args.fsdp:  # reduce-scatter once, after the step's last micro-batch
                ddp.set_requires_gradient_sync(last)
            sync = nullcontext() if last or args.fsdp else ddp.no_sync()
            with sync:
                out = ddp(**kw, num_items_in_batch=int(items))
                (out.loss * world).backward()
            loss_sum += out.loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(loss_sum)  # the step's mean token loss
        images = sum(0 if b.image_grid_thw is None else len(b.image_grid_thw) for b in packed)
        if log is not None:
            record = {"step": step + 1, "loss": float(loss_sum), "images_rank0": images}
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(f"step {step + 1}: loss {float(loss_sum):.3f} (ln 128 = {math.log(128):.2f})",
                  flush=True)  # fmt: skip
    dist.barrier()  # every rank is done with every collective
    if log is not None:
        log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without tearing DDP down: the reducer's process group joins gloo's loop threads while
    # holding the GIL, and one of them may be waiting for the GIL to free a tensor; under load
    # that deadlocks a rank at exit (seen with torch 2.13 and gloo, in a stack of the hung rank).
    os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
