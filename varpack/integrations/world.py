"""The Trainer's processes and the plan's ranks: one model over every process, or one line.

``transformers`` sets its processes up from what ``accelerate`` detects, and that need not be
what the launcher started. Under ``torchrun`` on a machine without a GPU, ``accelerate`` finds
no backend unless ``use_cpu=True``: every process trains a model of its own and the job exits 0,
while each :class:`~varpack.torch.loader.PlanLoader` reads its own rank of the plan (half the
data per model, no gradient ever averaged). Under ``srun`` alone (no ``LOCAL_RANK``) the same
happens on GPUs. :func:`settle_world` compares the Trainer's world with the launcher's
(``torch.distributed``'s when it is initialised, else torchrun's or Slurm's variables,
:func:`~varpack.torch.launch.launch_env`) before anything is built:

- on the CPU, where ``use_cpu=True`` changes nothing but the set-up (the device stays the CPU),
  it sets it, exports what torch's rendezvous reads under ``srun``, and sets the devices up
  again: DDP over gloo, as ``use_cpu=True`` would have given;
- anything else that disagrees is one line naming what to set.

:func:`check_world` then holds the Trainer's rank and world to the loader's: a loader made with
``rank=`` / ``world_size=`` that contradict the Trainer's processes is refused. One process
replaying one rank of a larger plan (``rank=0``, no launcher) stays allowed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch.distributed as dist

from varpack.errors import ConfigError
from varpack.torch.launch import export_torch_env, launch_env


class Launched(NamedTuple):
    """How many processes this job has, by whose word, and the launcher's name."""

    world: int
    how: str
    launcher: str  # "torch.distributed", "torchrun", "slurm" or "none"


def launched() -> Launched:
    """The job's processes: ``torch.distributed``'s world when initialised, else the launcher's
    variables (torchrun's ``WORLD_SIZE``, Slurm's ``SLURM_NTASKS``), else one."""
    if dist.is_available() and dist.is_initialized():
        n = dist.get_world_size()
        return Launched(n, f"torch.distributed has {n} processes", "torch.distributed")
    env = launch_env()
    if env.launcher == "torchrun":
        return Launched(env.world_size, f"torchrun started {env.world_size} processes", "torchrun")
    if env.launcher == "slurm":
        return Launched(env.world_size, f"srun started {env.world_size} tasks", "slurm")
    return Launched(1, "one process", "none")


def _on_cpu_only(args: Any) -> bool:
    """``use_cpu=True`` would only change the set-up: the device is the CPU already and no
    backend or engine that needs another device was asked for."""
    return (
        args.device.type == "cpu"
        and not args.use_cpu
        and not getattr(args, "deepspeed", None)
        and getattr(args, "ddp_backend", None) in (None, "gloo")
    )


def _set_up_again(args: Any) -> None:
    """``use_cpu=True`` and the devices set up again (``_setup_devices`` is a cached property;
    it resets accelerate's shared state itself)."""
    args.use_cpu = True
    args.dataloader_pin_memory = False  # what TrainingArguments does for use_cpu
    args.__dict__.pop("_setup_devices", None)
    _ = args._setup_devices


def _remedy(args: Any, job: Launched) -> str:
    if job.launcher == "slurm" and args.device.type != "cpu":
        return (
            "under srun, call varpack.torch.launch.export_torch_env(launch_env()) before making "
            "the TrainingArguments (it sets LOCAL_RANK, RANK, WORLD_SIZE), or launch with torchrun"
        )
    if args.device.type == "cpu":
        return "give TrainingArguments(use_cpu=True) and leave ddp_backend unset (gloo)"
    return (
        "launch with torchrun (it sets LOCAL_RANK, from which transformers sets up DDP), or "
        "give TrainingArguments(use_cpu=True) to train on the CPU over gloo"
    )


def settle_world(args: Any) -> None:
    """Make the Trainer's world the launcher's: on the CPU by ``use_cpu=True`` (in place), else
    :class:`ConfigError`, one line, before anything is built."""
    job = launched()
    if job.world <= 1 or args.world_size == job.world:
        return
    if args.world_size == 1 and _on_cpu_only(args):
        export_torch_env(launch_env())  # under srun alone: RANK, WORLD_SIZE, MASTER_ADDR, ...
        _set_up_again(args)
        if args.world_size == job.world:
            return
    if args.world_size != 1:
        raise ConfigError(
            f"{job.how} but the Trainer set itself up for {args.world_size} processes: launch "
            "them all with one launcher (torchrun, srun or accelerate launch)"
        )
    raise ConfigError(
        f"{job.how} but the Trainer set itself up as one process on {args.device} "
        f"(transformers found no distributed set-up to join), so each process would train a "
        f"model of its own: {_remedy(args, job)}"
    )


def check_world(args: Any, loader: Any) -> None:
    """The Trainer's rank and world must be the loader's (several processes), one line if not."""
    if getattr(args, "n_gpu", 0) > 1:
        raise ConfigError(
            f"{args.n_gpu} GPUs in one process (DataParallel): launch one process per GPU "
            "with torchrun, each replaying its own rank of the plan"
        )
    if args.world_size > 1 and (args.world_size, args.process_index) != (
        loader.world_size,
        loader.rank,
    ):
        raise ConfigError(
            f"this process is rank {args.process_index} of {args.world_size}, its PlanLoader "
            f"reads rank {loader.rank} of {loader.world_size}: make the loader without rank= / "
            "world_size= (it reads its rank from torchrun, srun or torch.distributed), and launch "
            f"the plan's dp={loader.plan.dp} processes"
        )


__all__ = ["Launched", "check_world", "launched", "settle_world"]
