"""The trainer's synchronisation held to the plan's ``sync``: one line where they disagree.

A plan is balanced for one synchronisation model (``config.sync``, ``varpack.plan.sync``):
``micro`` levels every micro-batch slot across the ranks, ``step`` every rank's sum over a step.
A trainer whose ranks shard the parameters (FSDP / FSDP2, DeepSpeed ZeRO-3) meets at every
micro-batch; DDP with ``no_sync``, ZeRO-1/2 and Megatron's data parallelism once per step.
:func:`sync_advice` says what a disagreement costs, by the plan's own figures
(``stats.time_vs_ideal_by_sync``):

- a ``step`` plan under a sharding trainer is harmful: each micro-batch waits for the slowest
  rank of its slot, which that plan never levelled, so the run takes the plan's time under
  ``micro``, above the figure it was balanced to: a warning, with the command that plans for it;
- a ``micro`` plan under a trainer that meets once per step is harmless (levelled slot by slot
  is levelled per step too): an informative line only, with the plan's time under both models
  and its lower bound where plan.json records them. It suggests no ``--sync step`` plan: what one
  would reach is not in the plan's figures (on some batches it does worse). ``micro`` is the
  planner's default and DDP the common trainer, so a warning there would greet most runs.

Nothing is said for one process (no one waits), one micro-batch per step (the two models are
the same), a ``step`` plan whose time under ``micro`` is its balanced time (levelled slot by slot
as it happens) or a trainer whose model is unknown. Pure and torch-free: the integrations and
``jobs/train.py`` tell the trainer's model and print the line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

#: each synchronisation model, as the lines say when its ranks meet
MEETS = {"micro": "at every micro-batch", "step": "once per optimizer step"}
#: times vs ideal closer than this are the same to the lines' three decimals
SAME = 5e-4


class SyncAdvice(NamedTuple):
    """What a trainer makes of a plan's ``sync``: a warning (``harmful``) or an informative line."""

    harmful: bool
    text: str


def plan_sync(meta: Mapping[str, Any]) -> str:
    """The model a plan was balanced for: ``config.sync``; a plan from before ``--sync`` was
    balanced per step.

    >>> plan_sync({"config": {"sync": "micro"}}), plan_sync({"config": {}})
    ('micro', 'step')
    """
    return str((meta.get("config") or {}).get("sync") or "step")


def sync_advice(
    plan: str, meta: Mapping[str, Any], trainer: str | None, how: str, world: int
) -> SyncAdvice | None:
    """The line for plan.json ``meta`` (of the plan at ``plan``) trained by ``world`` ranks of a
    trainer (``how``: its name) meeting as ``trainer`` says (``micro``, ``step``, ``None``:
    unknown); ``None`` where there is nothing to say.

    >>> meta = {"config": {"sync": "step"}, "layout": {"grad_accum": 4},
    ...         "stats": {"time_vs_ideal_by_sync": {"step": 1.01, "micro": 1.097}}}
    >>> sync_advice("plan/", meta, "micro", "FSDP", 8).harmful
    True
    >>> [sync_advice("plan/", meta, *other) for other in
    ...  [("step", "DDP", 8), ("micro", "FSDP", 1), (None, "?", 8)]]
    [None, None, None]
    >>> meta["stats"]["time_vs_ideal_by_sync"]["micro"] = 1.0102  # the same, to 3 decimals
    >>> sync_advice("plan/", meta, "micro", "FSDP", 8) is None
    True
    """
    sync = plan_sync(meta)
    ga = int((meta.get("layout") or {}).get("grad_accum") or 1)
    if trainer not in MEETS or trainer == sync or world <= 1 or ga <= 1:
        return None
    stats = meta.get("stats") or {}
    times = stats.get("time_vs_ideal_by_sync") or {}
    if trainer == "micro" and times.get("micro", 2.0) < times.get("step", 0.0) + SAME:
        return None  # levelled slot by slot as it happens: by its figures no time is lost
    said = f"{plan} was balanced for ranks that meet {MEETS[sync]} (--sync {sync}), but {how} "
    if trainer == "micro":
        return SyncAdvice(True, said + _harmful(plan, times, stats.get("time_vs_ideal")))
    return SyncAdvice(False, said + _harmless(times, stats.get("time_vs_ideal_bound")))


def _harmful(plan: str, times: Mapping[str, float], balanced: float | None) -> str:
    """A ``step`` plan under a trainer that meets at every micro-batch: what it costs, what to do.

    >>> print(_harmful("p/", {"step": 1.01, "micro": 1.097}, 1.01))  # doctest: +ELLIPSIS
    meets at every micro-batch: ... takes 1.097x the ideal time, not the 1.010x the plan ...
    """
    if "micro" in times and "step" in times:
        cost = f"takes {times['micro']:.3f}x the ideal time, not the {times['step']:.3f}x"
    else:  # a plan from before --sync records its time per step only
        cost = f"takes more than the {balanced or 1.0:.3f}x"
    return (
        f"meets {MEETS['micro']}: each micro-batch waits for the slowest rank of its slot, so the "
        f"run {cost} the plan was balanced to; plan again with --sync micro (varpack plan INPUT "
        f"OUT --sync micro, or from a run's step S: varpack replan {plan} OUT --from-step S "
        "--sync micro)"
    )


def _harmless(times: Mapping[str, float], bound: float | None = None) -> str:
    """A ``micro`` plan under a trainer that meets once per step: balanced there too, by the
    plan's own figures (nothing said of a plan it is not).

    >>> print(_harmless({"step": 1.012, "micro": 1.014}, 1.003))  # doctest: +ELLIPSIS
    meets once per optimizer step: balanced there too (1.012x ideal; 1.014x under micro; ...
    """
    figures = []
    if "micro" in times and "step" in times:
        figures = [f"{times['step']:.3f}x ideal", f"{times['micro']:.3f}x under micro"]
    if figures and isinstance(bound, int | float):
        figures.append(f"no composition of its samples into as many steps below {bound:.3f}x")
    return f"meets {MEETS['step']}: balanced there too" + (
        f" ({'; '.join(figures)})" if figures else ""
    )


__all__ = ["MEETS", "SAME", "SyncAdvice", "plan_sync", "sync_advice"]
