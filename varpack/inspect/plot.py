"""``varpack inspect --plot``: a plan drawn as one four-panel figure (PNG, via matplotlib).

Panels: the document length histogram (each document once, its length the sum of its pieces;
a split plan adds its pieces as planned, in outline), real tokens per micro-batch over the plan,
the LR factor per step, and each rank's load per step relative to the step mean. Above
:data:`BAND_STEPS` steps a line or a dot per step is a solid band, so every per-step panel
(tokens, LR, load, a blend's shares, CP memory) draws percentile bands instead: the min, p10,
median, p90 and max of each of :data:`BUCKETS` runs of consecutive steps (:func:`step_bands`). The plot reads the manifests and
scores micro-batches with the plan's own cost model (:func:`varpack.plan.kernels.micro.summarize`,
:func:`varpack.plan.sync.step_loads`). matplotlib is imported only when a plot is drawn
(the ``plot`` extra).

The figure is an output like any other (:mod:`varpack.atomic`): it must stay apart from the plan
and the plan's input, replaces an existing file only with ``--overwrite`` and only if it is a
figure varpack drew (:data:`CREATOR` in its metadata), and is written under a temporary name then
renamed, so an interrupted plot leaves no half-written image.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from varpack.atomic import atomic_file, check_output
from varpack.errors import ConfigError, VarpackError
from varpack.plan.config import PlanConfig
from varpack.plan.cp.cost import cp_load, cp_model
from varpack.plan.figures.words import held_text, points
from varpack.plan.kernels.micro import summarize
from varpack.plan.mix import step_shares
from varpack.plan.sync import step_loads
from varpack.planfile.format import load_plan
from varpack.planfile.rankrows import name_codes
from varpack.planfile.schema import config_of

_MAX_POINTS = 200_000
#: above this many steps, each per-step panel draws percentile bands over buckets of steps
BAND_STEPS = 500
#: buckets of consecutive steps the bands are drawn over
BUCKETS = 200
#: what the bands show in each bucket: min, p10, median, p90, max
QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)


def step_bands(
    step: np.ndarray, values: np.ndarray, num_steps: int, buckets: int = BUCKETS
) -> tuple[np.ndarray, np.ndarray]:
    """The :data:`QUANTILES` of ``values`` (each at its ``step``) in each of ``buckets`` runs of
    consecutive steps: ``(edges, bands)``, ``edges`` the ``buckets + 1`` step boundaries
    (bucket ``i`` holds steps ``edges[i] <= s < edges[i + 1]``), ``bands[j, i]`` quantile ``j``
    of bucket ``i`` (linear interpolation, as :func:`numpy.quantile`; NaN for an empty bucket).

    >>> edges, bands = step_bands(np.array([0, 0, 1, 2, 3, 3]), np.array([1, 3, 2, 9, 5, 7]), 4, 2)
    >>> edges.tolist(), bands[2].tolist()  # medians of [1, 3, 2] and [9, 5, 7]
    ([0, 2, 4], [2.0, 7.0])
    """
    nb = max(1, min(buckets, num_steps))
    edges = (np.arange(nb + 1, dtype=np.int64) * num_steps) // nb
    b = np.clip(np.searchsorted(edges, step, side="right") - 1, 0, nb - 1)
    v = np.asarray(values, dtype=np.float64)[np.lexsort((values, b))]
    count = np.bincount(b, minlength=nb)
    start = np.r_[0, np.cumsum(count)[:-1]]
    bands = np.full((len(QUANTILES), nb), np.nan)
    has = count > 0
    for j, q in enumerate(QUANTILES):
        pos = q * (count[has] - 1)
        lo = np.floor(pos).astype(np.int64)
        below, above = v[start[has] + lo], v[start[has] + np.ceil(pos).astype(np.int64)]
        bands[j, has] = below + (above - below) * (pos - lo)
    return edges, bands


def _bands(
    ax: Any, edges: np.ndarray, bands: np.ndarray, color: str, label: str | None = None
) -> None:
    """Draw :func:`step_bands`: min..max and p10..p90 shaded, the median as a line; with
    ``label`` (one series among several) only the median is named in the legend."""
    x = (edges[:-1] + edges[1:]) / 2
    ax.fill_between(x, bands[0], bands[4], step="mid", color=color, alpha=0.15, lw=0,
                    label=None if label else "min .. max")  # fmt: skip
    ax.fill_between(x, bands[1], bands[3], step="mid", color=color, alpha=0.4, lw=0,
                    label=None if label else "p10 .. p90")  # fmt: skip
    ax.plot(x, bands[2], drawstyle="steps-mid", color=color, lw=1, label=label or "median")
    if label is None:
        ax.legend(loc="best", fontsize="small")


def _thin(n: int) -> np.ndarray:
    """Indices of at most _MAX_POINTS evenly spaced items (plots stay light at any size)."""
    return (
        np.unique(np.linspace(0, n - 1, min(n, _MAX_POINTS)).astype(np.int64))
        if n
        else np.zeros(0, np.int64)
    )


#: image formats the figure may be written in (by the file's suffix)
FORMATS = ("png", "svg", "pdf")


def _plot_inputs(path: str | os.PathLike[str]) -> list[Path]:
    """What the figure must stay apart from: the plan directory, and its input where it exists."""
    inputs = [Path(path)]
    try:
        source = load_plan(path).meta.get("input", {}).get("source")
    except VarpackError:  # an unreadable plan is reported by the plot itself, once
        source = None
    if isinstance(source, str) and source and os.path.exists(source):
        inputs.append(Path(source))
    return inputs


#: the creator every figure names in its metadata (PNG text, SVG and PDF creator): how
#: ``--overwrite`` knows a figure varpack drew
CREATOR = "varpack inspect --plot"
_LOOK = 1 << 20  # bytes read at each end of a file to find it (PDF keeps it near the end)


def _replaceable(out: Path) -> bool:
    """``--overwrite`` replaces a figure varpack drew (a plain file naming :data:`CREATOR`),
    never another file, a directory or a link."""
    if not out.is_file() or out.is_symlink():
        return False
    try:
        with open(out, "rb") as fh:
            head = fh.read(_LOOK)
            fh.seek(max(0, out.stat().st_size - _LOOK))
            tail = fh.read(_LOOK)
    except OSError:
        return False
    return CREATOR.encode() in head or CREATOR.encode() in tail


def check_plot_output(
    path: str | os.PathLike[str], out: str | os.PathLike[str], overwrite: bool
) -> str:
    """Refuse, before any work, an unsafe figure path; returns its image format."""
    check_output(out, overwrite, _plot_inputs(path), owned=_replaceable)
    fmt = Path(out).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ConfigError(
            f"--plot {out}: name the figure with an image suffix ({', '.join('.' + f for f in FORMATS)})"
        )
    return fmt


def plot(
    path: str | os.PathLike[str], out: str | os.PathLike[str], overwrite: bool = False
) -> None:
    """Document length histogram, tokens per micro-batch, LR factor per step, per-rank load per
    step; per-step panels as percentile bands above :data:`BAND_STEPS` steps."""
    fmt = check_plot_output(path, out, overwrite)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    plan = load_plan(path, verify=True, full=True)
    cfg = config_of(plan.meta)
    mix = plan.meta.get("mix") if cfg.cp == 1 else None
    steps, ranks, tokens, costs, lens_all, places, offs, ids, starts = ([] for _ in range(9))
    srcs: list[np.ndarray] = []
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
        offs.append(off)
        ids.append(t.column("sample_ids").combine_chunks().flatten().to_numpy())
        if "sample_offsets" in t.column_names:  # a split plan: where each piece starts
            starts.append(t.column("sample_offsets").combine_chunks().flatten().to_numpy())
        if cfg.cp > 1:
            places.append(t.column("cp_placement").combine_chunks().flatten().to_numpy())
        if mix is not None:  # each sample's source, from the carried source column
            col_src = t.column(f"carry.{mix['column']}").combine_chunks().flatten()
            srcs.append(name_codes(col_src, list(mix["sources"])))
        lr[step] = t.column("lr_factor").to_numpy()
    step = np.concatenate(steps)
    rank = np.concatenate(ranks)
    cost = np.concatenate(costs)
    order = np.lexsort((rank, step))
    n = plan.num_steps
    banded = n > BAND_STEPS
    wide = cfg.cp > 1 or mix is not None
    fig, ax = plt.subplots(2, 3 if wide else 2, figsize=(19 if wide else 13, 8))
    lens = np.concatenate(lens_all)
    counts = np.concatenate([np.diff(o) for o in offs])
    if cfg.cp > 1:  # the CP cost model's times, and the CP panels
        cost = _cp_panels(ax[:, 2], cfg, counts, lens, np.concatenate(places), step, n)
    if mix is not None:
        _mix_panels(ax[:, 2], mix, np.repeat(step, counts), np.concatenate(srcs), lens, n)
    ends = lens + np.concatenate(starts) if starts else None
    _length_panel(ax[0, 0], np.concatenate(ids), lens, ends)
    tok = np.concatenate(tokens)
    if banded:
        _bands(ax[0, 1], *step_bands(step, tok, n), "tab:green")
        ax[0, 1].set(xlabel="step")
    else:
        keep = _thin(len(tok))
        ax[0, 1].plot(keep, tok[order][keep], ".", ms=2, color="tab:green")
        ax[0, 1].set(xlabel="micro-batch (step, rank order)")
    ax[0, 1].axhline(cfg.max_tokens, color="gray", lw=0.5) if cfg.max_tokens else None
    ax[0, 1].set(title="real tokens per micro-batch", ylabel="tokens")
    if banded:
        _bands(ax[1, 0], *step_bands(np.arange(n), lr, n), "tab:orange")
    else:
        ax[1, 0].plot(np.arange(n), lr, lw=0.8, color="tab:orange")
    ax[1, 0].axhline(1.0, color="gray", lw=0.5)
    ax[1, 0].set(title=f"LR factor per step ({cfg.lr_scaling})", xlabel="step", ylabel="factor")
    loads = step_loads(step, rank, cost, n, plan.dp)
    rel = loads / np.maximum(loads.mean(axis=1, keepdims=True), 1e-300)
    what = f"{cfg.cost}, CP time" if cfg.cp > 1 else cfg.cost
    if banded:  # every rank's load of every step, pooled by bucket of steps
        _bands(ax[1, 1], *step_bands(np.repeat(np.arange(n), plan.dp), rel.reshape(-1), n),
               "tab:purple")  # fmt: skip
        ax[1, 1].axhline(1.0, color="gray", lw=0.5)
        ax[1, 1].set(title=f"rank load / step mean, all ranks ({what})", xlabel="step",
                     ylabel="ratio")  # fmt: skip
    else:
        im = ax[1, 1].imshow(rel.T, aspect="auto", cmap="viridis", interpolation="nearest",
                             extent=(0, n, plan.dp - 0.5, -0.5))  # fmt: skip
        fig.colorbar(im, ax=ax[1, 1], label="rank load / step mean")
        ax[1, 1].set(title=f"per-rank load per step ({what})", xlabel="step", ylabel="rank")
        ax[1, 1].yaxis.set_major_locator(MaxNLocator(integer=True))  # ranks are whole numbers
    how = (
        f"; per-step panels: min, p10, median, p90, max over {min(BUCKETS, n)} buckets of "
        f"~{n / min(BUCKETS, n):,.0f} steps"
        if banded
        else ""
    )
    fig.suptitle(
        f"{path}: {n:,} steps, dp {plan.dp}, time {plan.meta['stats']['time_vs_ideal']:.3f}x "
        f"ideal{how}"
    )
    fig.tight_layout()
    try:
        with atomic_file(out, overwrite, _plot_inputs(path), owned=_replaceable) as tmp:
            # the temporary name has no image suffix
            fig.savefig(tmp, dpi=100, format=fmt, metadata={"Creator": CREATOR})
    finally:
        plt.close(fig)


def document_lengths(ids: np.ndarray, lens: np.ndarray, ends: np.ndarray | None) -> np.ndarray:
    """The length of every document a plan trains on, each once: a split document's length is
    where its last piece ends (``ends``: each piece's offset in its document plus its length),
    a sample planned in several epochs (or repeated by ``--mix``) counts once.

    >>> document_lengths(np.array([7, 3, 7, 3]), np.array([4, 5, 2, 5]), np.array([4, 5, 6, 5]))
    array([5, 6])
    """
    if len(ids) == 0:
        return np.zeros(0, np.int64)
    end = lens if ends is None else ends
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    first = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    return np.maximum.reduceat(np.asarray(end, np.int64)[order], first)


def _length_panel(ax: Any, ids: np.ndarray, lens: np.ndarray, ends: np.ndarray | None) -> None:
    """Histogram of the documents' lengths (each once); a split plan adds its pieces, as
    planned (every epoch), in outline."""
    docs = document_lengths(ids, lens, ends)
    edges = np.histogram_bin_edges(docs if len(docs) else lens, bins=100)
    ax.hist(
        docs, bins=edges, log=True, color="tab:blue", label=f"{len(docs):,} documents, each once"
    )
    if ends is not None:
        ax.hist(lens, bins=edges, log=True, histtype="step", color="black", lw=0.8,
                label=f"{len(lens):,} pieces as planned (every epoch)")  # fmt: skip
    ax.legend(loc="upper right", fontsize="small")
    ax.set(title="document lengths", xlabel="tokens", ylabel="count")


def _mix_panels(ax: Any, mix: dict[str, Any], sample_step: np.ndarray, code: np.ndarray,
                lens: np.ndarray, num_steps: int) -> None:  # fmt: skip
    """A blend's panels, plan.json's figures drawn: each source's token share of every step (its
    target dashed), and the share of the steps within each distance of every target, with the
    tolerance the summary counts against (and how many steps it holds)."""
    shares = step_shares(sample_step, code, lens.astype(np.float64), len(mix["sources"]),
                         num_steps)  # fmt: skip
    targets = np.array([f.get("target", f["weight"]) for f in mix["sources"].values()])
    keep = _thin(num_steps)
    for k, name in enumerate(mix["sources"]):
        if num_steps > BAND_STEPS:  # each source's bands, its median named
            _bands(ax[0], *step_bands(np.arange(num_steps), 100 * shares[k], num_steps),
                   f"C{k}", label=f"{name} (median)")  # fmt: skip
        else:
            ax[0].plot(keep, 100 * shares[k, keep], ".", ms=2, color=f"C{k}", label=name)
        ax[0].axhline(100 * targets[k], color=f"C{k}", ls="--", lw=0.8)
    ax[0].set(title="token share of each step (targets dashed)", xlabel="step", ylabel="%")
    ax[0].legend(loc="best", fontsize="small")
    full = shares[:, : max(num_steps - 1, 1)]  # the last step holds what is left
    dist = np.sort(100 * np.abs(full - targets[:, None]).max(axis=0))
    ax[1].plot(dist, 100 * np.arange(1, len(dist) + 1) / len(dist), color="tab:purple")
    tol = mix["tolerance"]
    held = held_text(mix).removeprefix("; ")
    ax[1].axvline(100 * tol, color="gray", lw=0.8, ls="--", label=f"tolerance {points(tol)}")
    ax[1].legend(loc="lower right", fontsize="small")
    ax[1].set(title=f"steps within a distance of every target\n{held}",
              xlabel="largest distance (points)", ylabel="% of steps")  # fmt: skip
    ax[1].title.set_fontsize("small")


def _cp_panels(ax: Any, cfg: PlanConfig, counts: np.ndarray, lens: np.ndarray,
               placement: np.ndarray, step: np.ndarray, num_steps: int) -> np.ndarray:  # fmt: skip
    """CP memory of each micro-batch's fullest CP rank (``step``: each micro-batch's, rank by
    rank), and each CP rank's load relative to its micro-batch's mean; returns every
    micro-batch's CP time (the DP ranks' load)."""
    model = cp_model(cfg)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    load = cp_load(offsets, lens, placement, model)
    fill = load.memory.max(axis=1) / (model.n * model.bucket)
    if num_steps > BAND_STEPS:
        _bands(ax[0], *step_bands(step, fill, num_steps), "tab:red")
        ax[0].set(xlabel="step")
    else:
        keep = _thin(len(fill))
        ax[0].plot(keep, fill[keep], ".", ms=2, color="tab:red")
        ax[0].set(xlabel="micro-batch (rank by rank)")
    ax[0].axhline(1.0, color="gray", lw=0.5)
    ax[0].set(title=f"CP memory: fullest of {model.n} CP ranks / bucket {model.bucket:,}",
              ylabel="fraction of the bucket")  # fmt: skip
    rel = load.compute / np.maximum(load.compute.mean(axis=1, keepdims=True), 1e-300)
    ax[1].hist(rel.reshape(-1), bins=60, log=True, color="tab:purple")
    ax[1].set(title="CP rank load / micro-batch mean", xlabel="ratio", ylabel="CP ranks")
    return load.cost
