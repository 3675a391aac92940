"""Example trainer: replay a varpack plan with DDP (torchrun; gloo on CPU, nccl on GPU).

    torchrun --standalone --nproc-per-node 2 jobs/train.py --plan PLAN --data TOKENS --out RUN

What it shows, in the order a real trainer needs it:

- ``PlanLoader`` gives this rank its micro-batches; ``batch.is_last_micro`` decides when DDP
  synchronises (``no_sync()`` on every other micro-batch);
- the loss of each micro-batch is the sum of its token losses times ``dp / D`` (``D`` = the
  step's supervised tokens, from the plan), so accumulated, all-reduced gradients are exactly the
  gradient of the step's mean token loss;
- ``VariableBatchSizeLR`` scales a warm-up + cosine schedule by the plan's per-step LR factor;
- ``--compile static`` compiles with ``dynamic=False`` after ``compile_warmup`` ran every shape;
- checkpoints hold model, optimizer, LR and loader cursor; ``--resume`` continues exactly and
  logs "resumed at step S of N (epoch E)";
- before anything is built, ``check_vocab`` compares the plan's token ids (this rank's samples)
  with the model's vocabulary: one line, exit 2, instead of an error deep inside the model;
- the final line gives the global tokens (every rank) and the per-rank tokens, each named;
- ``--log-by COL`` (a plan made with ``--carry COL``) adds each value's mean token loss to the
  log line, over every rank (``GroupTally``: per source, per language);
- ``--cp N`` replays a ``varpack plan --cp N`` plan as DP x CP (world = dp x N, CP groups of
  consecutive ranks): local samples whole on one CP rank, distributed ones as 2N-chunk shares
  with all-gathered K/V (``varpack.torch.cp``); the same loss normalisation over the whole world.

Attention (``--attention``, see ``varpack.torch.attention``): ``auto`` takes the fastest path that
keeps packed samples apart for this layout and device: flash-attn's or torch's varlen kernel over
``cu_seqlens``, then FlexAttention with a document ``BlockMask`` (CUDA, bf16), else SDPA with the
dense block-diagonal mask (CPU); padded batches use SDPA ``is_causal`` and no mask. What the layers
need is built once per micro-batch. With ``--compile``, the kernels get the row length as
``max_seqlen`` (constant per shape), so a static compile recompiles nothing after warm-up; the
count is logged at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from varpack.errors import ConfigError, InputError, VarpackError, env_int
from varpack.torch import (
    GroupTally,
    ParquetTokenDataset,
    PlanLoader,
    VariableBatchSizeLR,
    check_vocab,
    compile_warmup,
    compiled_graphs,
    cp,
    dummy_batch,
    group_losses,
    normalise,
    resolve_backend,
    token_losses,
)
from varpack.torch.checkpoint import check_run, check_world, load_checkpoint, save_checkpoint
from varpack.torch.model import PRESETS, TinyGPT, model_inputs, param_count_str


def _count(low: int, high: int | None = None) -> Any:
    """An argparse type: an integer in ``[low, high]`` (0 steps or -1 workers mean nothing)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is above {high}")
        return value

    return parse


def _positive(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be finite and above 0")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--plan", required=True, help="plan directory (varpack plan)")
    p.add_argument(
        "--data",
        required=True,
        help="token copy (varpack lengths --arrow-copy: *.arrow, memory-mapped; fast) or "
        "tokenized Parquet (sample_id + input_ids; slow random access)",
    )
    p.add_argument("--out", required=True, help="run directory: checkpoint, logs, records")
    p.add_argument(
        "--column",
        default="auto",
        help="token column (auto: input_ids, else tokens; the Arrow copy's is input_ids)",
    )
    p.add_argument(
        "--id-column",
        default="auto",
        help="id column (auto: sample_id, else id); 'none' if varpack lengths numbered the rows",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument(
        "--vocab-size", type=_count(1), default=None, help="override the preset's vocabulary"
    )
    p.add_argument(
        "--lr", type=_positive, default=3e-4, help="base LR (scaled per step by the plan)"
    )
    p.add_argument("--warmup-steps", type=_count(0), default=10)
    p.add_argument(
        "--max-steps", type=_count(1), default=None, help="stop after this many optimizer steps"
    )
    p.add_argument("--collate", choices=["packed", "padded", "blocks"], default=None)
    p.add_argument("--workers", type=_count(0), default=0, help="DataLoader workers")
    p.add_argument(
        "--attention",
        choices=["auto", "varlen", "flex", "flash", "mask", "causal"],
        default="auto",
        help="attention backend (causal: SDPA is_causal, padded batches only)",
    )
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--compile", choices=["none", "static", "dynamic"], default="none")
    p.add_argument(
        "--ckpt-every", type=_count(0), default=0, help="steps between checkpoints (0: at the end)"
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--log-every", type=_count(1), default=1)
    p.add_argument(
        "--log-by",
        default=None,
        metavar="COL",
        help="also log the mean loss per value of this carried column (varpack plan --carry COL)",
    )
    p.add_argument("--record", action="store_true", help="write OUT/record-rank-R.json (ids seen)")
    p.add_argument("--seed", type=_count(0, 2**64 - 1), default=0, help="torch's seed (0..2^64-1)")
    p.add_argument(
        "--cp",
        type=_count(1),
        default=1,
        help="context-parallel ranks (a --cp plan; world = dp x cp): each CP rank computes its "
        "local samples and its share of distributed ones (varpack.torch.cp); 1 replays whole "
        "micro-batches",
    )
    return p.parse_args(argv)


def setup_distributed() -> tuple[int, int, torch.device]:
    world = env_int("WORLD_SIZE", 1, low=1)
    cuda = torch.cuda.is_available()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if cuda:
        local = env_int("LOCAL_RANK", 0)
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def lr_lambda(warmup: int, total: int) -> Any:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (
            1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup)))
        )

    return f


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank, world, device = setup_distributed()
    out = Path(args.out)
    if not args.resume and (out / "checkpoint.pt").exists():  # never train over a run's state
        raise ConfigError(f"{out} holds a run's checkpoint.pt: pass --resume to continue that "
                          "run, or give another --out")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    id_column = None if args.id_column.lower() == "none" else args.id_column
    dataset = ParquetTokenDataset(args.data, column=args.column, id_column=id_column)
    check_world(args.plan, world // args.cp, out / "checkpoint.pt" if args.resume else None)
    loader = PlanLoader(
        args.plan,
        dataset,
        collate=args.collate,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        cp_size=args.cp,
    )
    if args.cp > 1 and args.compile != "none":
        raise ConfigError("--cp runs eagerly here; drop --compile")
    if args.log_by and args.cp > 1:
        raise ConfigError("--log-by needs whole samples on a rank; drop it with --cp")
    carried = [c["name"] for c in (loader.plan.meta.get("carry") or {}).get("columns", [])]
    if args.log_by and args.log_by not in carried:
        have = ", ".join(carried) or "none"
        raise ConfigError(
            f"--log-by {args.log_by}: the plan carries no such column (carried: {have}); "
            f"plan with --carry {args.log_by}"
        )
    tally = GroupTally()
    cp_group = cp.cp_group(args.cp) if args.cp > 1 else None
    cfg = PRESETS[args.preset]
    if args.vocab_size:
        cfg = type(cfg)(**{**cfg.__dict__, "vocab_size": args.vocab_size})
    # Before building anything: a token id >= the vocabulary would fail deep inside the model.
    # Every rank checks its own samples, and all stop together (no rank left waiting in DDP).
    all_or_none(
        lambda: check_vocab(loader, cfg.vocab_size, "--vocab-size (or a larger --preset)"), device
    )
    raw = TinyGPT(cfg).to(device)
    model: torch.nn.Module = raw
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=False)
    base = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(args.warmup_steps, loader.num_steps)
    )
    scheduler = VariableBatchSizeLR(base, loader.lr_factors())
    ckpt = out / "checkpoint.pt"
    step_done = 0
    if args.resume:
        if not ckpt.is_file():
            raise InputError(
                f"--resume: no checkpoint {ckpt}; give the --out of the run to continue, or "
                "leave out --resume to start"
            )
        state = load_checkpoint(ckpt)  # checksum, keys: one line when damaged
        check_run(ckpt, state.get("run", {}), run_options(args))
        loader.load_state_dict(state["loader"])  # another plan refused; a replan takes its parent's
        try:
            raw.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["lr"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"{ckpt}: its model does not fit this run's ({str(exc).splitlines()[0][:120]}); "
                "resume with the model options the run started with"
            ) from None
        step_done = state["steps_done"]
        cursor = loader.state_dict()
        log(rank, f"resumed at step {cursor['step']} of {loader.num_steps} (epoch {cursor['epoch']}); "
            f"{loader.steps} steps left in this pass")  # fmt: skip
    ddp: DDP | None = None
    if world > 1:
        model = ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile != "none":
        model = torch.compile(model, dynamic=args.compile == "dynamic")  # type: ignore[assignment]
    attention = args.attention
    resolved = (  # fails early, one line
        "cp" if args.cp > 1 else resolve_backend(attention, device, dtype, loader.layout)
    )
    if resolved == "flex" and device.type != "cuda":
        raise ConfigError(
            "--attention flex trains on CUDA only (FlexAttention has no CPU backward)"
        )
    # A compiled model must not specialise on the longest sample: give it the row length.
    max_seqlen = "batch" if args.compile == "none" else "row"

    def micro_loss(m: torch.nn.Module, batch: Any) -> torch.Tensor:
        if isinstance(batch, cp.CPBatch):  # all-gathered K/V for distributed samples
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                logits = m(**cp.cp_inputs(batch, cp_group))
            return normalise(cp.token_loss_sum(logits, batch), batch, world)
        inputs = model_inputs(batch, attention, dtype, max_seqlen=max_seqlen)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = m(**inputs)
        losses = token_losses(logits, batch.labels)
        if args.log_by and args.log_by in batch.carry:  # not in the compile warm-up's batches
            tally.add(*group_losses(batch, losses.detach(), args.log_by))
        return normalise(losses.sum(), batch, world)

    if args.compile == "static":
        t0 = time.perf_counter()
        shapes = compile_warmup(
            model,
            loader,
            loader.rank,
            lambda s: dummy_batch(s, loader.layout).to(device),
            micro_loss,
        )
        log(rank, f"compile warm-up: {len(shapes)} shapes in {time.perf_counter() - t0:.1f}s")
    graphs_warm = compiled_graphs()

    log(rank, f"model {args.preset} {param_count_str(raw.num_params())} params; plan {loader.num_steps} steps x "
        f"{loader.grad_accum} micro x dp {world // args.cp} x cp {args.cp}; layout {loader.layout}; attention {resolved}; device {device}")  # fmt: skip
    seen: list[int] = []
    step_loss = torch.zeros((), device=device)
    rank_tokens = win_tokens = tokens_total = rank_total = 0
    t_start = t_win = time.perf_counter()
    for batch in loader:
        batch = batch.to(device, non_blocking=True)
        # Gradients are all-reduced only on the step's last micro-batch (DDP no_sync before it).
        with (
            ddp.no_sync()
            if ddp is not None and not batch.is_last_micro
            else contextlib.nullcontext()
        ):
            loss = micro_loss(model, batch)
            loss.backward()
        step_loss += loss.detach()
        rank_tokens += batch.num_tokens
        rank_total += batch.num_tokens
        if args.record:
            seen.extend(batch.sample_ids.tolist())
        if not batch.is_last_micro:
            continue
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        lr_now = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step_done += 1
        win_tokens += batch.step_tokens
        tokens_total += batch.step_tokens
        if step_done % args.log_every == 0 or batch.step == loader.num_steps - 1:
            if dist.is_initialized():
                dist.all_reduce(step_loss)  # sum over ranks of dp/D * sum(losses) = dp * mean
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            log(rank, f"step {batch.step:5d}  loss {float(step_loss) / world:.4f}  lr {lr_now:.2e} "
                f"(x{batch.lr_factor:.3g})  step tokens {batch.step_tokens} (this rank {rank_tokens})  "
                f"{win_tokens / (now - t_win):,.0f} tok/s")  # fmt: skip
            if args.log_by:  # every rank takes part in the gather; rank 0 logs
                log(rank, f"step {batch.step:5d}  loss by {args.log_by}: "
                    f"{tally.line(tally.flush())}")  # fmt: skip
            win_tokens, t_win = 0, now
        step_loss.zero_()
        rank_tokens = 0
        if args.ckpt_every and step_done % args.ckpt_every == 0:
            checkpoint(rank, ckpt, raw, optimizer, scheduler, loader, step_done, run_options(args))
        if args.max_steps is not None and step_done >= args.max_steps:
            break
    checkpoint(rank, ckpt, raw, optimizer, scheduler, loader, step_done, run_options(args))
    if args.compile == "static":
        log(rank, f"recompiles after warm-up: {compiled_graphs() - graphs_warm}")
    elif args.compile == "dynamic":
        log(rank, f"graphs compiled (dynamic shapes): {compiled_graphs() - graphs_warm}")
    elapsed = time.perf_counter() - t_start
    log(rank, done_line(step_done, tokens_total, rank_total, world, elapsed, device))
    if args.record:
        record = {
            "rank": rank,
            "steps_done": step_done,
            "sample_ids": seen,
            "cursor": loader.state_dict(),
        }
        (out / f"record-rank-{rank}.json").write_text(json.dumps(record))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        _leave(0)


def _leave(code: int) -> None:
    """End a distributed run now: freeing a DDP model or a gloo group at interpreter teardown can
    deadlock (gloo's worker thread waits for the GIL that the destructor joining it holds), and
    everything the run writes is written and flushed by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options a checkpoint must be resumed with (they shape the model or its updates)."""
    return {k: getattr(args, k) for k in ("preset", "vocab_size", "dtype")}


def checkpoint(rank: int, path: Path, model: torch.nn.Module, opt: Any, lr: Any,
               loader: PlanLoader, steps: int, run: dict[str, Any]) -> None:  # fmt: skip
    if rank == 0:  # the loader cursor is rank-independent, so one copy serves every rank
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "lr": lr.state_dict(),
                 "loader": loader.state_dict(), "steps_done": steps, "run": run}  # fmt: skip
        save_checkpoint(path, state)
    if dist.is_initialized():
        dist.barrier()


def all_or_none(check: Any, device: torch.device) -> None:
    """Run ``check`` on every rank; if it raised a :class:`VarpackError` on any rank, raise on all
    (the rank's own error, or one naming the rank that failed), so that none waits forever in
    a collective the others never reach."""
    error: VarpackError | None = None
    try:
        check()
    except VarpackError as exc:
        error = exc
    if not dist.is_initialized():
        if error is not None:
            raise error
        return
    failed = torch.tensor(
        [dist.get_world_size() if error is None else dist.get_rank()], device=device
    )
    dist.all_reduce(failed, op=dist.ReduceOp.MIN)  # the lowest failing rank, or world size
    if error is not None:
        raise error
    if int(failed) < dist.get_world_size():
        raise InputError(f"rank {int(failed)} stopped before training (its error line says why)")


def done_line(
    steps: int, tokens: int, rank_tokens: int, world: int, elapsed: float, device: torch.device
) -> str:
    """The final line: global tokens (all ranks, from the plan's step totals) and the per-rank
    range (each rank's real tokens, gathered), so neither reads as the other."""
    per = torch.tensor([rank_tokens, -rank_tokens], dtype=torch.int64, device=device)
    if dist.is_initialized():
        dist.all_reduce(per, op=dist.ReduceOp.MAX)  # [max, -min] over ranks
    hi, lo = int(per[0]), -int(per[1])
    spread = f"{lo:,}" if lo == hi else f"{lo:,} .. {hi:,}"
    return (
        f"done: {steps} steps in {elapsed:.1f}s; {tokens:,} tokens in all (global: every rank, "
        f"{tokens / max(elapsed, 1e-9):,.0f} tok/s), {spread} per rank ({world} ranks)"
    )


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[train] {msg}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except VarpackError as exc:  # a user mistake: one line, exit 2 (as the varpack CLI does)
        sys.stderr.write(f"varpack: error: {exc}\n")  # one write: ranks share the stream
        if dist.is_initialized():
            _leave(2)
        sys.exit(2)
