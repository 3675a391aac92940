"""``varpack inspect --plot``: a plan drawn as one four-panel figure (PNG, via matplotlib).

Panels: the sample length histogram, real tokens per micro-batch over the plan, the LR factor per
step, and each rank's load per step relative to the step mean. The plot reads the manifests and
scores micro-batches with the plan's own cost model (:func:`varpack.plan.micro.summarize`,
:func:`varpack.plan.stats.step_loads`). matplotlib is imported only when a plot is drawn (the
``plot`` extra).
"""

from __future__ import annotations

import os

import numpy as np

from varpack.manifest.format import load_plan
from varpack.plan.config import PlanConfig
from varpack.plan.micro import summarize
from varpack.plan.stats import step_loads

_MAX_POINTS = 200_000


def _thin(n: int) -> np.ndarray:
    """Indices of at most _MAX_POINTS evenly spaced items (plots stay light at any size)."""
    return (
        np.unique(np.linspace(0, n - 1, min(n, _MAX_POINTS)).astype(np.int64))
        if n
        else np.zeros(0, np.int64)
    )


def plot(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """Length histogram, tokens per micro-batch, LR factor per step, per-rank load per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    plan = load_plan(path, verify=True)
    cfg = PlanConfig.from_mapping(plan.meta["config"]).resolved()
    steps, ranks, tokens, costs, lens_all = [], [], [], [], []
    lr = np.ones(plan.num_steps)
    for r in range(plan.dp):
        t = plan.rank_table(r, verify=False)
        col = t.column("seq_lens").combine_chunks()
        off = col.offsets.to_numpy().astype(np.int64)
        lens = col.flatten().to_numpy().astype(np.int64)
        micro = summarize(off - off[0], lens, cfg.micro_rule())
        step = t.column("step").to_numpy()
        steps.append(step)
        ranks.append(np.full(len(step), r))
        tokens.append(micro.tokens)
        costs.append(micro.cost)
        lens_all.append(lens)
        lr[step] = t.column("lr_factor").to_numpy()
    step = np.concatenate(steps)
    rank = np.concatenate(ranks)
    cost = np.concatenate(costs)
    order = np.lexsort((rank, step))
    fig, ax = plt.subplots(2, 2, figsize=(13, 8))
    lens = np.concatenate(lens_all)
    ax[0, 0].hist(lens, bins=100, log=True, color="tab:blue")
    ax[0, 0].set(title="sample lengths", xlabel="tokens", ylabel="samples")
    tok = np.concatenate(tokens)[order]
    keep = _thin(len(tok))
    ax[0, 1].plot(keep, tok[keep], ".", ms=2, color="tab:green")
    ax[0, 1].axhline(cfg.max_tokens or 0, color="gray", lw=0.5) if cfg.max_tokens else None
    ax[0, 1].set(
        title="real tokens per micro-batch",
        xlabel="micro-batch (step, rank order)",
        ylabel="tokens",
    )
    ax[1, 0].plot(np.arange(plan.num_steps), lr, lw=0.8, color="tab:orange")
    ax[1, 0].set(title=f"LR factor per step ({cfg.lr_scaling})", xlabel="step", ylabel="factor")
    loads = step_loads(step, rank, cost, plan.num_steps, plan.dp)
    rel = loads / np.maximum(loads.mean(axis=1, keepdims=True), 1e-300)
    bins = min(plan.num_steps, 1000)
    edges = np.linspace(0, plan.num_steps, bins + 1).astype(np.int64)
    binned = np.maximum.reduceat(rel, edges[:-1], axis=0) if plan.num_steps else rel
    im = ax[1, 1].imshow(
        binned.T,
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
        extent=(0, plan.num_steps, plan.dp - 0.5, -0.5),
    )
    fig.colorbar(im, ax=ax[1, 1], label="rank load / step mean")
    ax[1, 1].set(title=f"per-rank load per step ({cfg.cost})", xlabel="step", ylabel="rank")
    ax[1, 1].yaxis.set_major_locator(MaxNLocator(integer=True))  # ranks are whole numbers
    fig.suptitle(
        f"{path}: {plan.num_steps} steps, dp {plan.dp}, time {plan.meta['stats']['time_vs_ideal']:.3f}x ideal"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
