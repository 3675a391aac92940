"""An RL-style loop whose rollout batches varpack plans in memory (torchrun; gloo on the CPU).

    torchrun --standalone --nproc-per-node 2 jobs/rl_loop.py --strategy ddp fsdp --iterations 3

Each iteration, as verl, ROLL or OpenRLHF run one:

1. **a rollout batch**: synthetic here, the same on every rank (drawn from ``(seed, iteration)``)
   as a trainer's workers receive it: ``--prompts`` prompts x ``--group`` responses, prompts
   left-padded and responses right-padded (verl's layout), a quarter of the responses cut at
   ``--max-response``. Every rank plans from the whole batch's lengths and gets the same plan
   without communicating; ``gather_lengths`` shows the case where each rank holds only a shard;
2. **old log-probs**: a forward-only pass planned with ``plan_batch(forward_only=True)`` and its
   own budget (``--infer-tokens``): each rank runs its micro-batches, ``Rollout.restore`` puts
   its log-probs back in the batch's order and ``gather_outputs`` sums the ranks' parts;
3. **advantages**: each response's reward minus its group's mean (GRPO), on its tokens;
4. **updates**: ``plan_batch(mini_batches=K, groups=G, loss_tokens=...)``, one optimizer step
   per mini-batch (a group's responses in one): each rank runs its micro-batches with PPO's
   clipped loss summed over response tokens times ``dp / step_loss_tokens`` (the step's response
   tokens over all ranks, from the plan), so the averaged gradient is exactly the gradient of
   the step's mean token loss however the tokens were split.

``--strategy ddp`` (gradients synchronised once per step: ``no_sync`` until the last
micro-batch; planned with ``sync="step"``) or ``fsdp`` (FSDP2 ``fully_shard``, which gathers the
parameters for every micro-batch: ``sync="micro"``; gradients reduced at the last one). With
``--verify`` every iteration checks that all ranks hold the same plan, that every sample ran
exactly once, and that the planned forward pass's log-probs equal each sample's own.
``--timeout`` (600 s, jobs/train.py's) bounds the rendezvous: a rank whose peer never started
stops then in one line, exit 1, instead of waiting torch's default half hour.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from varpack.online import BatchPlan, plan_batch
from varpack.torch.job import Parser, count, positive, run_job
from varpack.torch.launch import LaunchEnv, export_torch_env, launch_env, rendezvous
from varpack.torch.model import GPTConfig, TinyGPT, model_inputs
from varpack.torch.rollout import Rollout, gather_lengths, gather_outputs, token_log_probs
from varpack.torch.watch import Watch, waiting

ATTENTION = {"PackedRollout": "segments", "PaddedRollout": "causal"}  # CPU: SDPA, no kernel probing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--strategy",
        choices=["ddp", "fsdp"],
        nargs="+",
        default=["ddp"],
        help="one or both, run in turn on the same batches (their losses compared)",
    )
    p.add_argument("--iterations", type=count(1), default=2)
    p.add_argument("--prompts", type=count(1), default=8, help="prompts per rollout batch")
    p.add_argument("--group", type=count(1), default=4, help="responses per prompt (GRPO)")
    p.add_argument("--max-prompt", type=count(1), default=16)
    p.add_argument("--max-response", type=count(1), default=24, help="the generation cap")
    p.add_argument("--mini-batches", type=count(1), default=2, help="optimizer steps a batch")
    p.add_argument("--train-tokens", type=count(1), default=64, help="micro-batch budget")
    p.add_argument("--infer-tokens", type=count(1), default=160, help="forward-only budget")
    p.add_argument("--layout", choices=["packed", "padded"], default="packed")
    p.add_argument("--lr", type=positive, default=1e-3)
    p.add_argument("--clip", type=positive, default=0.2)
    p.add_argument("--seed", type=count(0), default=0)
    p.add_argument("--verify", action="store_true", help="check plans, coverage and log-probs")
    p.add_argument("--timeout", type=positive, default=600.0,
                   help="seconds a rank waits for the others at the rendezvous before it stops "
                   "in one line, exit 1 (jobs/train.py's); each collective after it, that and "
                   "a minute (torch's deadline)")  # fmt: skip
    return p.parse_args(argv)


def rollout_batch(args: argparse.Namespace, iteration: int) -> dict[str, Any]:
    """Prompts left-padded, responses right-padded after them; rewards per response."""
    g = torch.Generator().manual_seed(args.seed * 1000 + iteration)
    n = args.prompts * args.group
    prompts = torch.randint(1, args.max_prompt + 1, (args.prompts,), generator=g)
    prompts = prompts.repeat_interleave(args.group)
    cut = torch.rand(n, generator=g) < 0.25  # a quarter of the responses hit the cap
    resp = torch.where(
        cut, args.max_response, torch.randint(1, args.max_response, (n,), generator=g)
    )
    p, r = args.max_prompt, args.max_response
    cols = torch.arange(p + r)
    mask = ((cols >= p - prompts[:, None]) & (cols < p + resp[:, None])).long()
    ids = torch.randint(1, 256, (n, p + r), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "response_mask": mask[:, p:],
            "rewards": torch.randn(n, generator=g)}  # fmt: skip


def advantages(data: dict[str, Any], group: int) -> torch.Tensor:
    """GRPO: each response's reward minus its group's mean, on each of its tokens."""
    r = data["rewards"].view(-1, group)
    adv = (r - r.mean(dim=1, keepdim=True)).reshape(-1, 1)
    return adv * data["response_mask"]


def clipped_loss_sum(logp: torch.Tensor, f: dict[str, torch.Tensor], clip: float) -> torch.Tensor:
    """PPO's clipped surrogate, summed over the response tokens of a micro-batch."""
    ratio = torch.exp(logp - f["old_log_probs"])
    adv = f["advantages"]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return -(surrogate * f["response_mask"]).sum()


def verify_plan(plan: BatchPlan, rank: int, world: int) -> None:
    """Every rank holds the same plan, and the ranks' micro-batches cover the batch once."""
    every: list[Any] = [None] * world
    mine = [mb.tolist() for step in plan.rank_steps(rank) for mb in step]
    dist.all_gather_object(every, (plan.digest(), mine))
    assert len({d for d, _ in every}) == 1, "ranks planned differently"
    ran = sorted(i for _, mbs in every for mb in mbs for i in mb)
    assert ran == list(range(len(plan.sample_step))), "a sample missing or run twice"


def log_probs(model: Any, roll: Rollout, plan: BatchPlan, rank: int, width: int) -> torch.Tensor:
    """The planned forward-only pass: this rank's part, then every rank's summed."""
    with torch.no_grad():
        mbs = roll.micro_batches(plan, rank, 0)
        outs = [token_log_probs(model(**model_inputs(mb, ATTENTION[type(mb).__name__])), mb)
                for mb in mbs]  # fmt: skip
        part = roll.restore(mbs, outs, width=width)
    return gather_outputs(part)


def check_log_probs(model: Any, data: dict[str, Any], old: torch.Tensor, width: int) -> float:
    """The largest gap between the planned pass and each sample run alone."""
    worst = 0.0
    mask = data["attention_mask"].bool()
    with torch.no_grad():
        for i in range(len(mask)):
            ids = data["input_ids"][i][mask[i]][None]
            lp = torch.log_softmax(model(ids, torch.arange(ids.shape[1])[None])[0, :-1].float(), -1)
            lp = lp.gather(-1, ids[0, 1:, None])[:, 0]
            r = int(data["response_mask"][i].sum())
            worst = max(worst, float((old[i, :r] - lp[-r:]).abs().max()))
    return worst


def train_step(
    model: Any, opt: Any, mbs: list[Any], dp: int, strategy: str, args: argparse.Namespace
) -> float:
    """One optimizer step over this rank's micro-batches; returns the step's loss (all ranks)."""
    total = torch.zeros(())
    for mb in mbs:
        last = mb.is_last_micro
        if strategy == "fsdp":
            model.set_requires_gradient_sync(last)  # reduce-scatter once, after the last
            ctx: Any = contextlib.nullcontext()
        else:
            ctx = contextlib.nullcontext() if last else model.no_sync()
        with ctx:
            logp = token_log_probs(model(**model_inputs(mb, ATTENTION[type(mb).__name__])), mb)
            loss = clipped_loss_sum(logp, mb.fields, args.clip) * dp / max(mb.step_loss_tokens, 1)
            loss.backward()
        total += loss.detach() / dp
    opt.step()
    opt.zero_grad(set_to_none=True)
    dist.all_reduce(total)
    return float(total)


def build_model(args: argparse.Namespace, strategy: str) -> tuple[Any, Any]:
    torch.manual_seed(args.seed)
    model = TinyGPT(GPTConfig())
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
    return model, torch.optim.SGD(model.parameters(), lr=args.lr)


def join(env: LaunchEnv, timeout: float) -> None:
    """The rendezvous (gloo), as jobs/train.py's: a peer that never comes stops this rank after
    ``timeout`` seconds in one line (``varpack.torch.watch``), torch's own deadline (a minute
    later) backing it and every later collective; one process joins a group of its own."""
    export_torch_env(env)  # under srun: RANK, WORLD_SIZE, MASTER_ADDR/PORT for env://
    where = "{}:{}, {} ranks".format(*rendezvous(env), env.world_size)
    hint = ("a rank was not launched or cannot reach rank 0 there (check the task count, "
            "MASTER_ADDR and MASTER_PORT)")  # fmt: skip
    with waiting(f"the rendezvous ({where})", hint, everyone=True):
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout + 60))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = launch_env()
    torch.set_num_threads(1)  # tiny tensors: one thread per process is fastest
    watch = Watch(args.timeout, env.rank, env.world_size, "[rl]") if env.world_size > 1 else None
    if watch is not None:
        watch.start()
    try:
        join(env, args.timeout)
    finally:
        if watch is not None:
            watch.close()
    first = {}
    for strategy in args.strategy:
        first[strategy] = run(args, strategy)
    if len(first) > 1 and dist.get_rank() == 0:
        a, b = first.values()
        print(f"[rl] first step's loss: {' vs '.join(f'{k} {v:.8f}' for k, v in first.items())} "
              f"(differ by {abs(a - b):.1e})", flush=True)  # fmt: skip
    dist.barrier()
    return 0


def run(args: argparse.Namespace, strategy: str) -> float:
    """``--iterations`` of the loop with one strategy; the first step's loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = build_model(args, strategy)
    sync = "micro" if strategy == "fsdp" else "step"
    width = args.max_response
    first = float("nan")
    for it in range(args.iterations):
        t0 = time.perf_counter()
        data = rollout_batch(args, it)
        roll = Rollout(data)
        share = np.array_split(roll.lengths, world)[rank]  # were each rank to hold a shard
        lengths, _ = gather_lengths(share)
        assert np.array_equal(lengths, roll.lengths)
        fwd = plan_batch(lengths, dp=world, max_tokens=args.infer_tokens, forward_only=True,
                         layout=args.layout, seed=it)  # fmt: skip
        data["old_log_probs"] = log_probs(model, roll, fwd, rank, width)
        data["advantages"] = advantages(data, args.group)
        roll = Rollout(data)
        plan = plan_batch(lengths, dp=world, max_tokens=args.train_tokens, sync=sync,
                          mini_batches=args.mini_batches, groups=args.group, layout=args.layout,
                          loss_tokens=roll.loss_tokens(), seed=it)  # fmt: skip
        if args.verify:
            verify_plan(fwd, rank, world)
            verify_plan(plan, rank, world)
            gap = check_log_probs(model, data, data["old_log_probs"], width)  # every rank:
            # FSDP gathers the parameters for each forward, so all ranks run the same ones
            assert gap < 1e-5, f"planned log-probs differ from each sample's own by {gap:.2e}"
        losses = [train_step(model, opt, roll.micro_batches(plan, rank, k), world, strategy, args)
                  for k in range(plan.num_steps)]  # fmt: skip
        first = losses[0] if it == 0 else first
        if rank == 0:
            fig = plan.figures["time_vs_ideal_by_sync"]
            print(f"[rl] {strategy} iteration {it}: {len(lengths)} samples, forward pass "
                  f"{fwd.micro_per_step} micro-batches a rank, {plan.num_steps} steps of "
                  f"{plan.micro_per_step}; time vs ideal {fig[sync]:.4f} ({sync} sync); "
                  f"loss {' '.join(f'{x:.6f}' for x in losses)}; "
                  f"{time.perf_counter() - t0:.2f}s", flush=True)  # fmt: skip
    with torch.no_grad():
        mine = sum(float((p.full_tensor() if hasattr(p, "full_tensor") else p).sum())
                   for p in model.parameters())  # fmt: skip
    every = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, torch.tensor([mine], dtype=torch.float64))
    if rank == 0:
        same = all(torch.equal(x, every[0]) for x in every)
        print(f"[rl] {strategy} done: {args.iterations} iterations, parameters "
              f"{'the same on every rank' if same else 'DIFFER across ranks'}"
              f"{', verified' if args.verify else ''}", flush=True)  # fmt: skip
    return first


if __name__ == "__main__":
    run_job(main)
