"""Example trainer: replay a varpack plan with DDP (torchrun; gloo on CPU, nccl on GPU).

    torchrun --standalone --nproc-per-node 2 jobs/train.py --plan PLAN --data TOKENS --out RUN
    srun --ntasks 2 python jobs/train.py --plan PLAN --data TOKENS --out RUN   # Slurm

What it shows, in the order a real trainer needs it:

- ``PlanLoader`` gives this rank its micro-batches; ``batch.is_last_micro`` decides when DDP
  synchronises (``no_sync()`` on every other micro-batch);
- the loss of each micro-batch is the sum of its token losses times ``dp / D`` (``D`` = the
  step's supervised tokens, from the plan), so accumulated, all-reduced gradients are exactly the
  gradient of the step's mean token loss;
- ``VariableBatchSizeLR`` scales a warm-up + cosine schedule by the plan's per-step LR factor;
- ``--compile static`` compiles with ``dynamic=False`` after ``compile_warmup`` ran every shape;
- one step count everywhere: step S is the run's S-th optimizer step, from 1, across resumes
  (log lines, ``metrics.jsonl``, ``--max-steps``, checkpoints; ``varpack.torch.records``);
- checkpoints hold model, optimizer, LR and loader cursor; ``--resume`` continues exactly and
  logs "resumed after step S (P of the plan's N steps done in epoch E, ...)";
- DDP meets once per step: a plan balanced for every micro-batch (``--sync micro``, for FSDP)
  is said in one note line with its time under both (``sync_note``), once per run;
- before anything is built, ``check_vocab`` compares the plan's token ids (this rank's samples)
  with the model's vocabulary: one line, exit 2, instead of an error deep inside the model;
- the final line gives this run's steps, its global tokens (every rank) and its per-rank
  tokens, each named;
- ``--log-by COL`` (a plan made with ``--carry COL``) adds each value's mean token loss to the
  log line, over every rank (``GroupTally``: per source, per language);
- ``--cp N`` replays a ``varpack plan --cp N`` plan as DP x CP (world = dp x N, CP groups of
  consecutive ranks): local samples whole on one CP rank, distributed ones as 2N-chunk shares
  with all-gathered K/V (``varpack.torch.cp``); the same loss normalisation over the whole world.
- ``OUT/metrics.jsonl`` (rank 0): one JSON object per logged step, appended on ``--resume``;
  ``--record``: ``OUT/record-steps-A-B-rank-R.json`` per rank and run segment;
- launched by torchrun, or by ``srun`` alone (``SLURM_PROCID``/``SLURM_NTASKS``, see
  ``varpack.torch.launch``): a launch environment that cannot make a job, or a world that is
  not the plan's dp, is one line before any rendezvous; every wait for the other ranks has a
  deadline (``--timeout``) and ends on a signal (``varpack.torch.watch``); Ctrl-C or SIGTERM
  stops every rank after the same step, saves a checkpoint and says so in one line; a user
  error is one line per job (``varpack.torch.job``).

Attention (``--attention``, see ``varpack.torch.attention``): ``auto`` takes the fastest path that
keeps packed samples apart for this layout and device: flash-attn's or torch's varlen kernel over
``cu_seqlens``, then FlexAttention with a document ``BlockMask`` (CUDA, bf16), else SDPA on each
sample's own tokens (``segments``; ``mask`` when compiled); padded batches use SDPA ``is_causal``.
What the layers need is built once per micro-batch. With ``--compile``, the kernels get the row
length as ``max_seqlen`` (constant per shape), so a static compile recompiles nothing after
warm-up; the count is logged at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from varpack.errors import ConfigError, InputError
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
from varpack.torch.checkpoint import check_run, load_checkpoint, run_options
from varpack.torch.job import (
    Parser,
    StopRequest,
    all_or_none,
    check_apart,
    check_plan_world,
    checkpoint,
    count,
    done_line,
    join,
    leave,
    log,
    lr_lambda,
    positive,
    run_job,
    sync_note,
)
from varpack.torch.launch import LaunchEnv, launch_env
from varpack.torch.model import PRESETS, TinyGPT, model_inputs, param_count_str
from varpack.torch.records import (
    MetricsLog,
    Records,
    interrupted_line,
    keep,
    plural,
    resumed_line,
)
from varpack.torch.watch import LostRanks, Watch, backend_error, first_line, gone, waiting


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, help="plan directory (varpack plan)")
    p.add_argument(
        "--data",
        required=True,
        help="token copy (varpack lengths --arrow-copy: *.arrow, memory-mapped; fast) or "
        "tokenized Parquet (sample_id + input_ids; slow random access)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="run directory: checkpoint.pt (model, optimizer, LR, loader cursor), metrics.jsonl "
        "(one JSON line per logged step) and, with --record, record-steps-A-B-rank-R.json",
    )
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
    p.add_argument(
        "--read",
        choices=["pread", "mmap"],
        default="pread",
        help="how an Arrow token copy is read: pread (RSS grows by the batch) or mmap",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument(
        "--vocab-size", type=count(1), default=None, help="override the preset's vocabulary"
    )
    p.add_argument(
        "--lr", type=positive, default=3e-4, help="base LR (scaled per step by the plan)"
    )
    p.add_argument("--warmup-steps", type=count(0), default=10)
    p.add_argument(
        "--max-steps",
        type=count(1),
        default=None,
        help="stop once this many optimizer steps are done in all (a resumed run counts the "
        "steps before it)",
    )
    p.add_argument(
        "--steps",
        type=count(1),
        default=None,
        help="run this many more optimizer steps from where it starts (with --max-steps: "
        "whichever comes first)",
    )
    p.add_argument("--collate", choices=["packed", "padded", "blocks"], default=None)
    p.add_argument("--workers", type=count(0), default=0, help="DataLoader workers")
    p.add_argument(
        "--attention",
        choices=["auto", "varlen", "flex", "flash", "segments", "mask", "causal"],
        default="auto",
        help="attention backend (causal: SDPA is_causal, padded batches only)",
    )
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--compile", choices=["none", "static", "dynamic"], default="none")
    p.add_argument(
        "--ckpt-every", type=count(0), default=0, help="steps between checkpoints (0: at the end)"
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--log-every", type=count(1), default=1)
    p.add_argument(
        "--log-by",
        default=None,
        metavar="COL",
        help="also log the mean loss per value of this carried column (varpack plan --carry COL)",
    )
    p.add_argument("--record", action="store_true",
                   help="write the sample ids each rank trained, one file per rank and run "
                   "segment: OUT/record-steps-A-B-rank-R.json")  # fmt: skip
    p.add_argument("--timeout", type=positive, default=600.0,
                   help="seconds a rank waits for the others at one point (the rendezvous, the "
                   "stop flag after each step, a checkpoint) before it stops in one line, exit 1")  # fmt: skip
    p.add_argument("--seed", type=count(0, 2**64 - 1), default=0, help="torch's seed (0..2^64-1)")
    p.add_argument("--cp", type=count(1), default=1,
                   help="context-parallel ranks (a --cp plan; world = dp x cp): each CP rank "
                   "computes its local samples and its share of distributed ones "
                   "(varpack.torch.cp); 1 replays whole micro-batches")  # fmt: skip
    return p.parse_args(argv)


def prepare(args: Any, world: int, device: torch.device) -> SimpleNamespace:
    """Everything before the first collective: options, plan, data, vocabulary, model, optimizer
    and the resumed state. Run on every rank under ``all_or_none``: one failing rank stops all."""
    out = Path(args.out)
    if not args.resume and (out / "checkpoint.pt").exists():  # never train over a run's state
        raise ConfigError(f"{out} holds a run's checkpoint.pt: pass --resume to continue that "
                          "run, or give another --out")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    id_column = None if args.id_column.lower() == "none" else args.id_column
    dataset = ParquetTokenDataset(args.data, column=args.column, id_column=id_column,
                                  read=args.read)  # fmt: skip
    ckpt = out / "checkpoint.pt"
    loader = PlanLoader(args.plan, dataset, collate=args.collate, num_workers=args.workers,
                        pin_memory=device.type == "cuda", cp_size=args.cp)  # fmt: skip
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
    resolved = "cp" if args.cp > 1 else resolve_backend(  # fails early, one line
        args.attention, device, dtype, loader.layout, compiled=args.compile != "none")  # fmt: skip
    if resolved == "flex" and device.type != "cuda":
        raise ConfigError("--attention flex trains on CUDA only (FlexAttention has no CPU "
                          "backward)")  # fmt: skip
    cfg = PRESETS[args.preset]
    if args.vocab_size:
        cfg = type(cfg)(**{**cfg.__dict__, "vocab_size": args.vocab_size})
    # Before building anything: a token id >= the vocabulary would fail deep inside the model.
    check_vocab(loader, cfg.vocab_size, "--vocab-size (or a larger --preset)")
    raw = TinyGPT(cfg).to(device)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=args.lr, weight_decay=0.0, foreach=False)
    base = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.warmup_steps,
                                                                   loader.num_steps))  # fmt: skip
    scheduler = VariableBatchSizeLR(base, loader.lr_factors())
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
    return SimpleNamespace(out=out, ckpt=ckpt, dtype=dtype, loader=loader, raw=raw,
                           optimizer=optimizer, scheduler=scheduler, step_done=step_done,
                           attention=resolved)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Train; the exit code: 0, or 128 + the signal that stopped the run (saved by then)."""
    args = parse_args(argv)
    stop = StopRequest()  # Ctrl-C / SIGTERM: finish the step, save, one line
    try:
        env = launch_env()  # a launch that cannot make a job: one line, before anything waits
        check_apart(args.out, (args.plan, args.data))
        check_plan_world(args.plan, Path(args.out) / "checkpoint.pt", args.resume, args.cp, env)
        # every wait for the other ranks ends on a deadline or a signal (one process: none)
        watch = Watch(args.timeout, env.rank, env.world_size) if env.world_size > 1 else None
        stop.watched = watch is not None and bool(watch.start())
        if watch is not None and args.resume:  # what a stop before the first step leaves
            watch.kept = f"{Path(args.out) / 'checkpoint.pt'} is as it was; resume with --resume"
        try:
            return train(args, stop, env, watch)
        finally:
            if watch is not None:
                watch.close()
    finally:
        stop.restore()  # a caller's own handlers again (main() run in-process)


def train(args: argparse.Namespace, stop: StopRequest, env: LaunchEnv, watch: Watch | None) -> int:
    device, group = join(env, args.timeout)  # group: stop flags and error messages, off the GPU
    rank, world = (dist.get_rank() if dist.is_initialized() else 0), env.world_size
    job = all_or_none(lambda: prepare(args, world, device), group)
    out, ckpt, dtype, loader, raw = job.out, job.ckpt, job.dtype, job.loader, job.raw
    optimizer, scheduler, step_done = job.optimizer, job.scheduler, job.step_done
    first = step_done + 1  # this run's first step
    stop_at = min((s for s in (args.max_steps, args.steps and step_done + args.steps) if s),
                  default=None)  # fmt: skip
    if args.resume:
        log(rank, resumed_line(step_done, loader.state_dict(), loader.num_steps, loader.steps))
    tally = GroupTally()
    cp_group = cp.cp_group(args.cp) if args.cp > 1 else None
    model: torch.nn.Module = raw
    ddp: DDP | None = None
    if world > 1:
        model = ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile != "none":
        model = torch.compile(model, dynamic=args.compile == "dynamic")  # type: ignore[assignment]
    resolved = job.attention  # auto as resolved for this device and compile mode; cp: per batch
    attention = args.attention if resolved == "cp" else resolved
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
        shapes = compile_warmup(model, loader, loader.rank,
                                lambda s: dummy_batch(s, loader.layout).to(device), micro_loss)  # fmt: skip
        log(
            rank,
            f"compile warm-up: {plural(len(shapes), 'shape')} in {time.perf_counter() - t0:.1f}s",
        )
    graphs_warm = compiled_graphs()

    log(rank, f"model {args.preset} {param_count_str(raw.num_params())} params; plan "
        f"{plural(loader.num_steps, 'step')} x {plural(loader.grad_accum, 'micro-batch', 'micro-batches')} x dp "
        f"{world // args.cp} x cp {args.cp}; layout {loader.layout}; attention {resolved}; device {device}")  # fmt: skip
    log(rank, sync_note(loader.plan, world // args.cp))  # a plan balanced for another sync
    if rank == 0:  # every file in OUT belongs to the run its checkpoint continues
        Records(out).forget(step_done if args.resume else None)
    metrics = MetricsLog(out / "metrics.jsonl", step_done if args.resume else None, rank == 0)
    seen: list[int] = []
    step_loss = torch.zeros((), device=device)
    rank_tokens = win_tokens = win_steps = tokens_total = rank_total = 0
    saved_at = step_done if args.resume else -1  # the step the checkpoint on disk holds
    kept = keep(watch, ckpt, saved_at, step_done)  # what an early stop leaves
    t_start = t_win = time.perf_counter()
    signum = stop.agreed(group)  # a signal during the set-up: stop before the first step
    reached = stop_at is not None and step_done >= stop_at
    if reached:
        log(rank, f"{plural(step_done, 'step')} done already (--max-steps {args.max_steps}): "
            "nothing to run")  # fmt: skip
    if watch is not None:
        watch.training()
    try:
        for batch in [] if signum or reached else loader:
            batch = batch.to(device, non_blocking=True)
            # Gradients are all-reduced only on the step's last micro-batch (DDP no_sync before).
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
            win_steps += 1
            win_tokens += batch.step_tokens
            tokens_total += batch.step_tokens
            last = stop_at is not None and step_done >= stop_at
            if step_done % args.log_every == 0 or batch.step == loader.num_steps - 1 or last:
                with waiting("the step's loss"):
                    if dist.is_initialized():  # sum over ranks of dp/D * sum(losses) = dp * mean
                        dist.all_reduce(step_loss)
                    groups = tally.flush() if args.log_by else {}  # every rank gathers
                if device.type == "cuda":
                    torch.cuda.synchronize()
                now = time.perf_counter()
                mean = float(step_loss) / world
                log(rank, f"step {step_done:5d}  loss {mean:.4f}  lr {lr_now:.2e} "
                    f"(x{batch.lr_factor:.3g})  step tokens {batch.step_tokens} (this rank {rank_tokens})  "
                    f"{win_tokens / (now - t_win):,.0f} tok/s")  # fmt: skip
                record = {"step": step_done, "epoch": batch.epoch, "plan_step": batch.step,
                          "loss": mean, "tokens": batch.step_tokens, "lr": lr_now,
                          "step_time_s": (now - t_win) / win_steps}  # fmt: skip
                if args.log_by:
                    log(rank, f"step {step_done:5d}  loss by {args.log_by}: {tally.line(groups)}")
                    record["loss_by"] = {
                        str(k): s / max(n, 1) for k, (s, n) in sorted(groups.items())
                    }
                metrics.write(record)
                win_tokens, win_steps, t_win = 0, 0, now
            step_loss.zero_()
            rank_tokens = 0
            if watch is not None:
                watch.step = step_done
            if args.ckpt_every and step_done % args.ckpt_every == 0:
                checkpoint(
                    rank, ckpt, raw, optimizer, scheduler, loader, step_done, run_options(args)
                )
                saved_at = step_done
                kept = keep(watch, ckpt, saved_at, step_done)
            signum = stop.agreed(group)  # every rank stops after the same step
            if signum and watch is not None:
                watch.agreed()
            if signum or last:
                break
    except RuntimeError as exc:  # a collective of the step failed: a peer is gone
        if not backend_error(exc):
            raise
        raise LostRanks(f"rank {rank}: step {step_done + 1} failed ({first_line(exc)}){gone(exc)}; "
                        f"{kept}") from None  # fmt: skip
    fresh = step_done > saved_at  # a step since the last checkpoint (or none yet)
    if fresh:
        checkpoint(rank, ckpt, raw, optimizer, scheduler, loader, step_done, run_options(args))
        kept = keep(watch, ckpt, step_done, step_done)
    metrics.close()
    if args.compile == "static":
        log(rank, f"recompiles after warm-up: {compiled_graphs() - graphs_warm}")
    elif args.compile == "dynamic":
        log(rank, f"graphs compiled (dynamic shapes): {compiled_graphs() - graphs_warm}")
    elapsed = time.perf_counter() - t_start
    log(rank, done_line(step_done - first + 1, first, tokens_total, rank_total, world, elapsed,
                        device))  # fmt: skip
    if args.record:
        Records(out).write(rank, world, first, step_done, seen, loader.state_dict())
    if signum:
        log(rank, interrupted_line(signum, loader.state_dict(), loader.num_steps, ckpt, fresh,
                                   step_done))  # fmt: skip
    code = 128 + signum if signum else 0
    if dist.is_initialized():
        with waiting("the end of the run"):
            dist.barrier()
        dist.destroy_process_group()
        leave(code, True)  # now: freeing the DDP model at this frame's end can deadlock
    return code


if __name__ == "__main__":
    run_job(main)
