"""The parts of a training job around its loop: joining the other ranks, stopping on a signal,
errors agreed by every rank, checkpoints, the final line (``jobs/train.py`` uses them all).

- :func:`join`: this process's device, and the rendezvous with the other ranks, each checked
  before anything waits (``varpack.torch.launch``); the rendezvous is a watched wait
  (``varpack.torch.watch``: a deadline, and a signal ends it at once).

- :class:`StopRequest`: SIGINT and SIGTERM are noted, not raised; at the end of each optimizer
  step every rank learns whether any rank got one (:meth:`StopRequest.agreed`), so all stop
  after the same step, save, and the job says so in one line. A second signal stops at once.
  Every wait for the other ranks here (the stop flag, the set-up check, the barrier after a
  checkpoint, the final figures) is a watched one: it ends on a signal or a timeout.
- :func:`all_or_none`: a setup that may fail on some ranks only; each rank learns the first
  failing rank's message (:class:`JobError`), so none waits in a collective and rank 0 alone
  prints it.
- :func:`run_job`: the top of a job's process: a :class:`~varpack.errors.VarpackError` is one
  line (written to torchelastic's error file too), exit 2; a bug keeps its traceback; a
  distributed process then leaves with ``os._exit`` (see :func:`leave`).
- :func:`sync_note`: the plan's ``--sync`` against DDP's schedule, one line where they differ.
- ``metrics.jsonl`` and the ``--record`` files: ``varpack.torch.records``.

Imports: torch, ``varpack.errors``, ``varpack.planfile.trainer_sync``,
``varpack.torch.checkpoint``, ``varpack.torch.launch``, ``varpack.torch.records``,
``varpack.torch.watch``.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from varpack.errors import ConfigError, Interrupted, VarpackError
from varpack.planfile.trainer_sync import sync_advice
from varpack.torch.checkpoint import check_world, save_checkpoint
from varpack.torch.launch import (
    LaunchEnv,
    LaunchError,
    best_rank,
    cuda_index,
    export_torch_env,
    launch_env,
    record_error,
    rendezvous,
)
from varpack.torch.records import plural
from varpack.torch.watch import holding, waiting


def count(low: int, high: int | None = None) -> Callable[[str], int]:
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


def positive(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be finite and above 0")
    return value


class Parser(argparse.ArgumentParser):
    """An option error in one line (no usage block), printed by rank 0 of the job only."""

    def error(self, message: str) -> NoReturn:
        try:
            quiet = launch_env().rank != 0
        except VarpackError:
            quiet = best_rank() != 0
        self.exit(2, None if quiet else f"{self.prog}: error: {message}\n")


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up over ``warmup`` steps, then cosine from 1 down to 0.1 at ``total``."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (
            1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup)))
        )

    return f


def rank() -> int:
    """This process's rank: the process group's, else the launcher's (as far as it reads)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return launch_env().rank
    except VarpackError:
        return best_rank()


def log(rank: int, msg: str | None) -> None:
    """``msg`` on rank 0 (``None``: nothing to say)."""
    if rank == 0 and msg is not None:
        print(f"[train] {msg}", flush=True)


def sync_note(plan: Any, dp: int) -> str | None:
    """What a DDP job (its ranks meet once per step, ``no_sync`` before) makes of ``plan``'s
    ``sync`` over ``dp`` data-parallel ranks: a ``--sync micro`` plan is balanced for it too,
    by the plan's own figures (``varpack.planfile.trainer_sync``)."""
    advice = sync_advice(str(plan.path), plan.meta, "step", "DDP", dp)
    return None if advice is None else f"{'warning' if advice.harmful else 'note'}: {advice.text}"


def join(env: LaunchEnv, timeout: float) -> tuple[torch.device, Any]:
    """This process's device and, with other ranks, the rendezvous (gloo on CPU, NCCL on GPU)
    and the CPU group for small agreements (:func:`cpu_group`). Everything that can be checked
    alone is checked first; the rendezvous waits at most ``timeout`` seconds (torch's own
    deadline, a minute later, backs it), and a signal ends it at once."""
    device = torch.device("cpu")
    if torch.cuda.is_available():  # srun --gpus-per-task=1 shows each task one device: index 0
        device = torch.device("cuda", cuda_index(env.local_rank, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    if env.world_size == 1:
        return device, None
    export_torch_env(env)  # under srun: RANK, WORLD_SIZE, MASTER_ADDR/PORT for env://
    where = "{}:{}, {}".format(*rendezvous(env), plural(env.world_size, "rank"))
    hint = ("a rank was not launched or cannot reach rank 0 there (check the task count, "
            "MASTER_ADDR and MASTER_PORT)")  # fmt: skip
    with waiting(f"the rendezvous ({where})", hint, everyone=True):
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout + 60))
        return device, cpu_group()


def check_apart(out: str, inputs: tuple[str, ...]) -> None:
    """The run's files never go into an input: ``out`` is not, and is not inside, one of them
    (the same on every rank, so rank 0 alone says it)."""
    ro = Path(os.path.realpath(out))
    for item in inputs:
        ri = Path(os.path.realpath(item))
        if ro == ri or ri in ro.parents:
            raise JobError(f"--out {out} is or lies inside the input {item}; write the run "
                           "elsewhere")  # fmt: skip


def check_plan_world(plan: str, ckpt: Path, resume: bool, cp: int, env: LaunchEnv) -> None:
    """Before any rendezvous: the job's world against the plan's dp (every rank reads the same
    plan.json, so rank 0 alone says it). A plan or checkpoint that does not read is left to the
    set-up, whose error every rank agrees on (:func:`all_or_none`)."""
    if env.world_size % cp:
        raise JobError(f"--cp {cp} does not divide this job's {plural(env.world_size, 'rank')}: "
                       f"launch a multiple of {cp}")  # fmt: skip
    try:
        check_world(plan, env.world_size // cp, ckpt if resume else None)
    except ConfigError as exc:
        raise JobError(str(exc)) from None
    except VarpackError:
        pass


def cpu_group() -> Any:
    """A process group for small CPU collectives (stop flags, error messages): the default one
    under gloo, a gloo group beside NCCL (no device sync for them). Every rank must call it."""
    if not dist.is_initialized() or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


class StopRequest:
    """SIGINT / SIGTERM as a request to stop after the current optimizer step.

    The handlers note the signal; a second one raises :class:`~varpack.errors.Interrupted` where
    the process is (stop now, nothing saved). DataLoader workers forked after this inherit the
    handlers, so a Ctrl-C to the process group does not kill them mid-step.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum = 0
        self.watched = False  # a running Watch takes the second signal (it sees it when blocked)
        self._old = {sig: signal.signal(sig, self._note) for sig in self.SIGNALS}

    def restore(self) -> None:
        """The handlers there were before."""
        for sig, old in self._old.items():
            if old is not None:  # None: not set from Python; nothing to put back
                signal.signal(sig, old)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.signum and not self.watched:
            raise Interrupted(signum)
        self.signum = signum

    def agreed(self, group: Any = None) -> int:
        """The signal any rank got (0: none), the same on every rank: one tiny all-reduce."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.signum
        flag = torch.tensor([self.signum], dtype=torch.int64)
        with waiting("the step's stop flag"):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return int(flag)


class JobError(VarpackError):
    """An error every rank raised together (:func:`all_or_none`): rank 0 alone prints it."""


def all_or_none(check: Callable[[], Any], group: Any = None) -> Any:
    """Run ``check`` on every rank and return its result; if it raised on any rank, raise on all
    a :class:`JobError` with the first failing rank's message, so that none waits forever in a
    collective the others never reach. ``check`` itself must use no collective. A bug (not a
    :class:`~varpack.errors.VarpackError`) is re-raised on its rank, with its traceback."""
    error: Exception | None = None
    result = None
    try:
        result = check()
    except Exception as exc:
        error = exc
    if not (dist.is_available() and dist.is_initialized()):
        if error is not None:
            raise error
        return result
    mine = None  # (message, exit code) of this rank's error
    if isinstance(error, VarpackError):
        mine = (str(error), error.exit_code)
    elif error is not None:
        first = (str(error).splitlines() or [""])[0][:200]
        mine = (
            f"rank {dist.get_rank()} failed before training: {type(error).__name__}: {first}",
            1,
        )
    every: list[tuple[str, int] | None] = [None] * dist.get_world_size()
    with waiting("the set-up check"):
        dist.all_gather_object(every, mine, group=group)
    failed = [m for m in every if m is not None]
    if error is not None and not isinstance(error, VarpackError):
        raise error
    if failed:
        agreed = JobError(failed[0][0])
        agreed.exit_code = failed[0][1]
        raise agreed
    return result


def checkpoint(rank: int, path: Path, model: torch.nn.Module, opt: Any, lr: Any, loader: Any,
               steps: int, run: dict[str, Any]) -> None:  # fmt: skip
    """Rank 0 saves model, optimizer, LR and loader cursor (rank-independent), never cut short by
    a signal; all wait for it."""
    if rank == 0:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "lr": lr.state_dict(),
                 "loader": loader.state_dict(), "steps_done": steps, "run": run}  # fmt: skip
        with holding():
            save_checkpoint(path, state)
    if dist.is_available() and dist.is_initialized():
        with waiting("the barrier after the checkpoint"):
            dist.barrier()


def done_line(steps: int, first: int, tokens: int, rank_tokens: int, world: int,
              elapsed: float, device: torch.device) -> str:  # fmt: skip
    """The final line, every figure of this run's own steps (``first`` .. ``first + steps - 1``
    of the whole run, named when it was resumed): global tokens (all ranks, from the plan's step
    totals) and the per-rank range (each rank's real tokens, gathered), so neither reads as the
    other."""
    per = torch.tensor([rank_tokens, -rank_tokens], dtype=torch.int64, device=device)
    if dist.is_available() and dist.is_initialized():
        with waiting("the final figures"):
            dist.all_reduce(per, op=dist.ReduceOp.MAX)  # [max, -min] over ranks
    hi, lo = int(per[0]), -int(per[1])
    spread = f"{lo:,}" if lo == hi else f"{lo:,} .. {hi:,}"
    which = f" (steps {first} to {first + steps - 1} of the run)" if first > 1 and steps else ""
    return (
        f"done: {plural(steps, 'step')}{which} in {elapsed:.1f}s; {plural(tokens, 'token')} in "
        f"all (global: every rank, {tokens / max(elapsed, 1e-9):,.0f} tok/s), {spread} per rank "
        f"({plural(world, 'rank')})"
    )


def leave(code: int, distributed: bool) -> NoReturn:
    """End the process with ``code``. A distributed one leaves with ``os._exit``, whether or
    not its process group was destroyed: freeing a DDP model or a gloo group at interpreter
    teardown can deadlock (gloo's worker thread waits for the GIL that the destructor joining it
    holds) or abort (``terminate called without an active exception``, SIGABRT), and
    everything the run writes is written and flushed by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    if distributed or (dist.is_available() and dist.is_initialized()):
        os._exit(code)
    sys.exit(code)


def run_job(main: Callable[[], int]) -> NoReturn:
    """Run a job's ``main`` (it returns its exit code) and end the process: a user error in
    one line, once per job; a second Ctrl-C in one line; a bug with its traceback. Each path
    leaves while the exception still holds ``main``'s frame: its DDP model must not be freed
    before ``os._exit`` (see :func:`leave`); a distributed ``main`` calls :func:`leave` itself."""
    try:
        code = main()
    except VarpackError as exc:  # a user mistake: one line (as the varpack CLI does)
        message = f"varpack: error: {exc}"
        shared = isinstance(exc, JobError) or (isinstance(exc, LaunchError) and not exc.own)
        if not shared or rank() == 0:
            sys.stderr.write(message + "\n")  # one write: ranks share the stream
        record_error(message)
        leave(exc.exit_code, _distributed())
    except Interrupted as exc:  # a second signal while the first was being honoured
        if rank() == 0:
            sys.stderr.write(f"[train] interrupted ({exc.name} twice): stopped at once, nothing "
                             "saved; resume with --resume from the last checkpoint\n")  # fmt: skip
        leave(exc.exit_code, _distributed())
    except Exception:
        traceback.print_exc()
        leave(1, _distributed())
    leave(code, _distributed())


def _distributed() -> bool:
    try:
        return launch_env().world_size > 1
    except VarpackError:
        return False


__all__ = [
    "JobError",
    "Parser",
    "StopRequest",
    "all_or_none",
    "check_apart",
    "check_plan_world",
    "checkpoint",
    "count",
    "cpu_group",
    "done_line",
    "join",
    "leave",
    "log",
    "lr_lambda",
    "positive",
    "rank",
    "run_job",
    "sync_note",
]
