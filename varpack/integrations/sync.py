"""What the trainer's ranks wait on, read from ``accelerate``'s state, held to the plan's ``sync``.

A plan balanced for ranks that meet once per step (``--sync step``) is not levelled micro-batch
by micro-batch; trained with sharded parameters (FSDP / FSDP2, DeepSpeed ZeRO-3: every
micro-batch all-gathers them) it runs at its time under ``micro``, above the figure it was
balanced to. :func:`check_sync` says so in one :class:`PlanSyncWarning` on rank 0, once per run
(:class:`~varpack.integrations.hf.VarpackTrainer` calls it when built; a plain ``accelerate``
loop after ``accelerator.prepare``); the harmless other way round (a ``micro`` plan under DDP)
is an informative ``logging`` line. The decision is :func:`~varpack.planfile.trainer_sync.sync_advice`.

:func:`strategy` reads the state defensively (attributes that may be missing or raise; nothing
imports DeepSpeed): FSDP (``distributed_type`` FSDP or an ``fsdp_plugin``, not ``NO_SHARD``),
DeepSpeed by its ZeRO stage, a model wrapped in FSDP by hand; other data parallelism meets once
per step.

What is held to the plan is what runs, not what was asked. ``accelerate`` sets FSDP up on
accelerators only: on the CPU, ``TrainingArguments(fsdp=...)`` or ``accelerate launch
--use_fsdp`` train plain DDP (``distributed_type`` ``MULTI_CPU``), so a plugin under ``NO`` or
``MULTI_*`` counts for nothing, and :func:`check_sync` says in a :class:`StrategyWarning` that
the FSDP asked for does not run. :func:`running` holds the state to the job's processes: under
torchrun, an ``Accelerator()`` that set itself up as one process (the CPU without ``cpu=True``)
runs data parallelism only through a model wrapped by hand (DDP, FSDP); else each process would
train a model of its own, and that is one :class:`~varpack.errors.ConfigError`.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, NamedTuple

from varpack.errors import ConfigError
from varpack.integrations.world import launched
from varpack.planfile.trainer_sync import MEETS, SyncAdvice, sync_advice

logger = logging.getLogger(__name__)

#: class names of a module whose parameters are sharded (FSDP's wrapper; FSDP2's fully_shard)
SHARDED_MODULES = ("FullyShardedDataParallel", "FSDPModule")
#: class names of a module whose gradients are averaged over the ranks, parameters whole
REPLICATED_MODULES = ("DistributedDataParallel",)


class PlanSyncWarning(UserWarning):
    """The plan was balanced for ranks that meet once per step; this trainer's meet at every
    micro-batch."""


class StrategyWarning(UserWarning):
    """The trainer was asked for one distributed strategy (FSDP) and runs another."""


class Strategy(NamedTuple):
    """When the trainer's ranks meet (``micro``, ``step``, ``None``: cannot tell), its name,
    and its number of processes."""

    sync: str | None
    name: str
    world: int


def _attr(obj: Any, name: str) -> Any:
    """``obj.name``, or ``None`` where it is missing or its property raises."""
    try:
        return getattr(obj, name, None)
    except Exception:  # a property of a half set-up state
        return None


def _kind(state: Any) -> str:
    """``distributed_type`` as its name (an enum of ``str``, or a plain string)."""
    kind = _attr(state, "distributed_type")
    return str(_attr(kind, "value") or kind or "NO").upper()


def _zero_stage(plugin: Any) -> int | None:
    """A DeepSpeed plugin's ZeRO stage: ``zero_stage``, else its config's; ``None`` if unknown."""
    stage = _attr(plugin, "zero_stage")
    if stage is None:
        config = _attr(plugin, "deepspeed_config")
        zero = config.get("zero_optimization") if isinstance(config, dict) else None
        stage = zero.get("stage") if isinstance(zero, dict) else None
    try:
        return int(stage)
    except (TypeError, ValueError):  # None, "auto"
        return None


def _fsdp(plugin: Any, world: int) -> Strategy:
    """FSDP meets at every micro-batch (parameters all-gathered for each), unless it shards
    nothing (FSDP1's ``NO_SHARD``: DDP's schedule)."""
    version = _attr(plugin, "fsdp_version") or 1
    shard = _attr(plugin, "sharding_strategy")
    if version == 1 and str(_attr(shard, "name") or shard).upper().endswith("NO_SHARD"):
        return Strategy("step", "FSDP with NO_SHARD", world)
    return Strategy("micro", "FSDP2" if version == 2 else "FSDP", world)


def _wrapped(model: Any, names: tuple[str, ...]) -> bool:
    """``model``, or a module it wraps, is of one of the classes ``names`` (by class name:
    nothing imported)."""
    for _ in range(4):
        if model is None:
            return False
        if any(c.__name__ in names for c in type(model).__mro__):
            return True
        model = _attr(model, "module")
    return False


def _sharded(model: Any) -> bool:
    """``model``, or a module it wraps, is an FSDP module."""
    return _wrapped(model, SHARDED_MODULES)


def strategy(state: Any, model: Any = None) -> Strategy:
    """When the ranks of ``state`` (``accelerator.state``) meet, and how many there are."""
    world = _attr(state, "num_processes")
    world = world if isinstance(world, int) and world > 0 else 1
    kind, plugin = _kind(state), _attr(state, "fsdp_plugin")
    if plugin is not None and (kind == "NO" or kind.startswith("MULTI_")):
        plugin = None  # a plugin the state holds but does not run: accelerate's type says so
    if kind == "FSDP" or plugin is not None:
        return _fsdp(plugin, world)
    if kind == "DEEPSPEED":
        stage = _zero_stage(_attr(state, "deepspeed_plugin"))
        if stage is None:
            return Strategy(None, "DeepSpeed", world)
        return Strategy("micro" if stage >= 3 else "step", f"DeepSpeed ZeRO-{stage}", world)
    if _sharded(model):
        return Strategy("micro", "FSDP", world)
    if kind == "MEGATRON_LM":
        return Strategy("step", "Megatron-LM", world)
    if kind == "NO" or kind.startswith("MULTI_"):
        return Strategy("step", "DDP" if world > 1 else "one process", world)
    return Strategy(None, kind, world)  # XLA and what comes next: not told here


def running(state: Any, model: Any = None) -> Strategy:
    """What runs: :func:`strategy` of ``state``, held to the job's processes (the process
    group's, else the launcher's: :func:`~varpack.integrations.world.launched`). A state of one
    process in a job of several runs data parallelism only where the model is wrapped for it
    by hand (DDP, FSDP); else each process trains a model of its own: one line."""
    found = strategy(state, model)
    job = launched()
    if found.world > 1 or job.world <= 1:
        return found
    if _sharded(model):
        return Strategy("micro", "FSDP", job.world)
    if _wrapped(model, REPLICATED_MODULES):
        return Strategy("step", "DDP", job.world)
    told = "the model is not wrapped for data parallelism" if model is not None else (
        "no model was given to check_sync"
    )  # fmt: skip
    raise ConfigError(
        f"{job.how}, but accelerate set itself up as one process (distributed_type "
        f"{_kind(state)}) and {told}: each process would train a model of its own, no gradient "
        "averaged; on the CPU give Accelerator(cpu=True) (TrainingArguments(use_cpu=True)), or "
        "launch with accelerate launch; a model wrapped by hand: check_sync(accelerator, "
        "loader, model)"
    )


def asked(args: Any = None) -> str | None:
    """The sharded strategy asked for: FSDP by ``TrainingArguments(fsdp=...)`` or by
    ``accelerate launch --use_fsdp`` (``ACCELERATE_USE_FSDP``); ``None`` if none."""
    if _attr(args, "fsdp") or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return "FSDP"
    return None


def _not_run(wanted: str | None, found: Strategy, state: Any) -> str | None:
    """The line where ``wanted`` (FSDP) was asked and ``found`` runs instead."""
    if wanted is None or found.world <= 1 or found.name.startswith(wanted):
        return None
    kind = _kind(state)
    why = " (accelerate sets FSDP up on accelerators only)" if kind in ("NO", "MULTI_CPU") else ""
    return (
        f"{wanted} was asked, but {found.name} runs over {found.world} processes (accelerate's "
        f"distributed_type {kind}){why}: its ranks meet {MEETS.get(found.sync or '', '?')} and "
        "each holds the whole model; the plan's sync is held to what runs"
    )


def check_sync(
    accelerator: Any, loader: Any, model: Any = None, wanted: str | None = None
) -> SyncAdvice | None:
    """The plan of ``loader`` against the trainer of ``accelerator`` (or its state), as it
    runs (:func:`running`): a :class:`PlanSyncWarning` where the plan's balance understates the
    wait, an informative ``logging`` line where the plan and the trainer differ harmlessly, said
    on rank 0; a :class:`StrategyWarning` first where ``wanted`` (default: :func:`asked`, FSDP
    from ``accelerate launch``) is not what runs. Call it once per run; returns what it found
    (on every rank)."""
    state = _attr(accelerator, "state") or accelerator
    found = running(state, model)
    advice = sync_advice(str(loader.plan.path), loader.plan.meta, found.sync, found.name,
                         found.world)  # fmt: skip
    if (_attr(state, "process_index") or 0) != 0:
        return advice
    note = _not_run(wanted or asked(), found, state)
    if note is not None:
        warnings.warn(note, StrategyWarning, stacklevel=2)
    if advice is None:
        return advice
    if advice.harmful:
        warnings.warn(advice.text, PlanSyncWarning, stacklevel=2)
    else:
        logger.info(advice.text)
    return advice


__all__ = [
    "PlanSyncWarning",
    "Strategy",
    "StrategyWarning",
    "asked",
    "check_sync",
    "running",
    "strategy",
]
