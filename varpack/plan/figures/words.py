"""How ``plan``, ``validate`` and ``inspect`` name a plan's figures, one way everywhere.

* samples and pieces: a plan's samples are the input's documents (those ``--where``
  selected); ``--oversize split`` makes pieces of the long ones (a sample that fits is one
  piece), and the epochs repeat them (:func:`samples_text`); tokens planned are the kept
  tokens times the epochs (:func:`tokens_text`), tokens kept are what ``--oversize`` kept of
  the input's, or of the selected (:func:`token_line`); a shape is rows × tokens per row
  (:func:`shape_text`). Each count names its noun, singular or plural (:func:`counted`).
* LR factors: the factor of a step is ``scaling(realised batch / --base-batch-size)``
  (:mod:`varpack.plan.lr`). A base batch far from what a step really holds moves every factor the
  same way: ``--base-batch-size 64`` with steps of 4 to 10 samples and ``--lr-scaling sqrt``
  multiplies the LR by 0.25 to 0.4 all run long. The range and median are shown
  (:func:`lr_text`), and :func:`lr_note` says so, and which flag sets it, when the median factor
  is below ``1 / FAR`` or above ``FAR``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: a median factor below 1 / FAR or above FAR earns a note
FAR = 2.0


def lr_spread(lr: np.ndarray) -> tuple[float, float, float]:
    """``(min, median, max)`` of the steps' LR factors (1s for a plan without steps).

    >>> lr_spread(np.array([0.5, 0.25, 2.0]))
    (0.25, 0.5, 2.0)
    """
    lr = np.asarray(lr, dtype=np.float64)
    if len(lr) == 0:
        return 1.0, 1.0, 1.0
    return float(lr.min()), float(np.median(lr)), float(lr.max())


def lr_text(lr: np.ndarray, scaling: str) -> str:
    """``LR factor MIN .. MAX, median M (SCALING)``.

    >>> lr_text(np.array([0.5, 0.25, 2.0]), "sqrt")
    'LR factor 0.25 .. 2, median 0.5 (sqrt)'
    """
    lo, mid, hi = lr_spread(lr)
    return f"LR factor {lo:.3g} .. {hi:.3g}, median {mid:.3g} ({scaling})"


def lr_note(
    lr: np.ndarray,
    scaling: str,
    base: float | None,
    unit: str,
    step_samples: np.ndarray,
    step_tokens: np.ndarray,
) -> str | None:
    """A note when the median factor is far from 1 (below 1 / :data:`FAR` or above it): the
    steps' batch against ``--base-batch-size``, and what to set; ``None`` otherwise.

    >>> print(lr_note(np.sqrt([4, 9, 10]) / 8, "sqrt", 64.0, "samples", np.array([4, 9, 10]),
    ...               np.array([40, 90, 100])))  # doctest: +NORMALIZE_WHITESPACE
    note: the LR factors are mostly far below 1 (median 0.375, 0.25 .. 0.395): a step holds 4 .. 10
    samples (median 9) against --base-batch-size 64 (--base-unit samples), and --lr-scaling sqrt
    multiplies the LR by sqrt(step / base); set --base-batch-size near a typical step (9 samples)
    to keep the factors near 1
    """
    if scaling == "none" or not base or len(lr) == 0:
        return None
    lo, mid, hi = lr_spread(lr)
    if 1 / FAR <= mid <= FAR:
        return None
    batch = np.asarray(step_tokens if unit == "tokens" else step_samples, dtype=np.int64)
    typical = int(np.median(batch))
    rule = {"sqrt": "sqrt(step / base)", "linear": "step / base"}.get(scaling, scaling)
    return (
        f"note: the LR factors are mostly far {'below' if mid < 1 else 'above'} 1 (median "
        f"{mid:.3g}, {lo:.3g} .. {hi:.3g}): a step holds {int(batch.min()):,} .. "
        f"{int(batch.max()):,} {unit} (median {typical:,}) against --base-batch-size {base:,.6g} "
        f"(--base-unit {unit}), and --lr-scaling {scaling} multiplies the LR by {rule}; set "
        f"--base-batch-size near a typical step ({typical:,} {unit}) to keep the factors near 1"
    )


def counted(n: int, noun: str) -> str:
    """``n`` and its noun, singular or plural.

    >>> counted(1, "rank"), counted(2, "micro-batch"), counted(1_000, "step"), counted(0, "piece")
    ('1 rank', '2 micro-batches', '1,000 steps', '0 pieces')
    """
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {noun}{'es' if noun.endswith(('ch', 'sh', 's', 'x')) else 's'}"


def layout_text(steps: int, dp: int, grad_accum: int) -> str:
    """``S steps x R ranks x M micro-batches``, as ``plan`` and ``validate`` say it.

    >>> layout_text(1, 1, 1), layout_text(5_110, 2, 4)
    ('1 step x 1 rank x 1 micro-batch', '5,110 steps x 2 ranks x 4 micro-batches')
    """
    return (
        f"{counted(steps, 'step')} x {counted(dp, 'rank')} x {counted(grad_accum, 'micro-batch')}"
    )


def samples_text(
    samples: int,
    dropped: int,
    epochs: int,
    t: dict[str, Any] | None,
    drawn: int | None = None,
    pieces: int | None = None,
) -> str:
    """A plan's samples, one way everywhere (``plan``, ``validate``, ``inspect``): the input's
    samples (documents), those dropped, the pieces a split makes of them (one per sequence
    trained on: a sample that fits is one piece), and the epochs; ``drawn``: the samples a
    ``--mix`` drew (repeats included) from the input's ``samples``, in ``pieces`` if split.

    >>> t = {"documents_split": 2, "pieces": 7}
    >>> samples_text(10, 0, 2, t)
    '10 samples (15 pieces after splitting) x 2 epochs'
    >>> samples_text(10, 3, 1, None), samples_text(10, 0, 1, None, drawn=4)
    ('10 samples (3 dropped)', '4 samples drawn by --mix from 10')
    >>> samples_text(1, 0, 1, {"documents_split": 1, "pieces": 1}), samples_text(1, 0, 1, None, 1)
    ('1 sample (1 piece after splitting)', '1 sample drawn by --mix from 1')
    >>> samples_text(10, 0, 1, t, drawn=4, pieces=6)
    '4 samples drawn by --mix from 10 (6 pieces after splitting)'
    """
    extra = [f"{dropped:,} dropped"] if dropped else []
    if drawn is not None:
        if pieces is not None and pieces != drawn:
            extra.append(f"{counted(pieces, 'piece')} after splitting")
        return f"{counted(drawn, 'sample')} drawn by --mix from {samples:,}" + "".join(
            f" ({e})" for e in extra
        )
    if t and t.get("pieces"):
        pieces = samples - dropped - int(t["documents_split"]) + int(t["pieces"])
        extra.append(f"{counted(pieces, 'piece')} after splitting")
    text = counted(samples, "sample") + (f" ({', '.join(extra)})" if extra else "")
    return text + (f" x {epochs} epochs" if epochs > 1 else "")


def tokens_text(real: int, epochs: int, t: dict[str, Any] | None, mixed: bool = False) -> str:
    """The tokens a plan trains on, ``tokens planned``, with the epochs that multiply them
    (``t``: the token figures, whose ``kept`` counts one epoch) or the ``--mix`` that drew them.

    >>> tokens_text(20, 2, {"kept": 10, "total": 10}), tokens_text(9, 1, {"kept": 9})
    ('20 tokens planned = 2 epochs x 10', '9 tokens planned')
    >>> tokens_text(4, 1, {"kept": 10, "total": 12}, mixed=True)  # from the tokens kept
    '4 tokens drawn by --mix from 10'
    """
    how = tokens_how(real, epochs, t, mixed)
    if mixed and t:
        return f"{counted(real, 'token')} {how}"
    return f"{counted(real, 'token')} planned" + (f" {how}" if how else "")


def tokens_how(real: int, epochs: int, t: dict[str, Any] | None, mixed: bool = False) -> str:
    """How the tokens planned came about, when more than the tokens kept once: ``= 2 epochs x
    10``, ``drawn by --mix from 10``, ``over 3 epochs`` (an empty string otherwise).

    >>> tokens_how(20, 2, {"kept": 10}), tokens_how(9, 1, {"kept": 9}), tokens_how(7, 3, None)
    ('= 2 epochs x 10', '', 'over 3 epochs')
    """
    if mixed and t:
        return f"drawn by --mix from {int(t['kept']):,}"
    if epochs > 1 and t and real == epochs * int(t["kept"]):
        return f"= {epochs} epochs x {int(t['kept']):,}"
    return f"over {epochs} epochs" if epochs > 1 else ""


def token_line(t: dict[str, Any] | None, lead: str = "tokens ") -> str:
    """Tokens kept (of the input's, or of those ``--where`` selected), split and dropped, as
    counts and shares; one epoch's.

    >>> token_line({"total": 10, "kept": 9, "split": 4, "dropped": 1, "kept_share": 0.9,
    ...     "split_share": 0.4, "dropped_share": 0.1, "documents_split": 1, "pieces": 2})
    'tokens kept 9 of 10 (90.00%), split 4 (40.00%: 1 document in 2 pieces), dropped 1 (10.00%)'
    """
    if not t:
        return f"{lead}kept ? (plan made before these figures)"
    pieces = (
        f": {counted(int(t['documents_split']), 'document')} in {counted(int(t['pieces']), 'piece')}"
        if t["documents_split"]
        else ""
    )
    return (
        f"{lead}kept {t['kept']:,} of {t['total']:,} ({100 * t['kept_share']:.2f}%), split "
        f"{t['split']:,} ({100 * t['split_share']:.2f}%{pieces}), dropped {t['dropped']:,} "
        f"({100 * t['dropped_share']:.2f}%)"
    )


def plan_epochs(meta: dict[str, Any]) -> int:
    """How many epochs a plan.json's plan runs (its config's; 1 for a replanned plan's part)."""
    if "parent" in meta:
        return 1
    return int(meta.get("config", {}).get("epochs") or len(meta.get("epochs") or [0]))


def shape_text(shape: list[int]) -> str:
    """A micro-batch shape, rows × tokens per row.

    >>> shape_text([1, 8192])
    '1×8,192'
    """
    return f"{shape[0]:,}×{shape[1]:,}"


def mix_drawn(m: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """The samples a ``--mix`` drew (repeats included) and, when it split them, their pieces.

    >>> mix_drawn({"sources": {"a": {"planned_samples": 3, "planned_pieces": 5}}}), mix_drawn(None)
    ((3, 5), (None, None))
    """
    if not m:
        return None, None
    figs = m["sources"].values()
    pieces = [f["planned_pieces"] for f in figs if "planned_pieces" in f]
    return sum(int(f["planned_samples"]) for f in figs), sum(pieces) if pieces else None


def points(share: float) -> str:
    """A distance between shares, in percentage points.

    >>> points(0.02), points(0.0973)
    ('2 points', '9.73 points')
    """
    return f"{100 * share:.3g} points"


def mix_text(m: dict[str, Any]) -> str:
    """plan.json's ``mix`` on one line (``plan`` prints it): each source's weight, repeat factor
    and token share of the steps (min .. max), then how many steps hold every source within the
    tolerance and the distance 95 % of them are within.

    >>> m = {"unit": "tokens", "total": 90, "tolerance": 0.02,
    ...      "sources": {"a": {"weight": 0.5, "repeat": 1.5}},
    ...      "shares": {"a": {"min": 0.4, "max": 0.61}},
    ...      "steps": {"steps": 10, "within": 7, "p95": 0.0973, "max": 0.11}}
    >>> mix_text(m)
    'mix by tokens, total 90: a 0.5 (x1.50; steps 40.0..61.0%); 7 of 10 steps hold every source within 2 points of its target, 95% within 9.73 points'
    """
    parts = [
        f"{name} {f['weight']:.3g} (x{f['repeat']:.2f}; steps {100 * m['shares'][name]['min']:.1f}"
        f"..{100 * m['shares'][name]['max']:.1f}%)"
        for name, f in m["sources"].items()
    ]
    return f"mix by {m['unit']}, total {m['total']:,}: " + ", ".join(parts) + held_text(m)


def held_text(m: dict[str, Any]) -> str:
    """``; K of N steps hold every source within T of its target, 95% within D`` (a plan made
    before these figures: each source's share of the steps within the tolerance)."""
    tol, s = points(m["tolerance"]), m.get("steps")
    if s is None:
        each = ", ".join(f"{n} {100 * f['held']:.1f}%" for n, f in m["shares"].items())
        return f"; steps within {tol}: {each}"
    return (
        f"; {s['within']:,} of {s['steps']:,} steps hold every source within {tol} of its "
        f"target, 95% within {points(s['p95'])}"
    )


def mix_note(m: dict[str, Any]) -> str | None:
    """The note (stderr) of a blend some of whose steps hold a source further from its target
    than the tolerance: how many, which sources, what the steps hold, what to change."""
    out = {name: s["outside"] for name, s in m["shares"].items() if s["outside"]}
    if not out:
        return None
    each = ", ".join(f"{name} in {n:,}" for name, n in out.items())
    s = m.get("steps")
    if s is None:
        held, accept = each, ""
    else:
        held = (f"{s['steps'] - s['within']:,} of {s['steps']:,} steps are outside it ({each}); "
                f"95% of the steps are within {points(s['p95'])}")  # fmt: skip
        accept = f", or --mix-tolerance {np.ceil(1000 * s['p95']) / 1000:g} accepts what they hold"
    return (
        f"note: the steps do not all hold the mix within {points(m['tolerance'])} "
        f"(--mix-tolerance): {held}; a larger --grad-accum or --max-tokens gives steps more "
        f"samples to hold the weights{accept}"
    )


def mix_rows(m: dict[str, Any]) -> list[tuple[str, str]]:
    """``inspect``'s lines of a blend: the unit, total and tolerance, each source's figures (the
    ones ``plan`` prints, and what was drawn of it), and the steps within the tolerance."""
    rows = [("mix", f"by {m['unit']} of column {m['column']}, total {m['total']:,}; "
                    f"tolerance {points(m['tolerance'])}")]  # fmt: skip
    for name, f in m["sources"].items():
        sh = m["shares"][name]
        pieces = f" in {f['planned_pieces']:,} pieces" if "planned_pieces" in f else ""
        rows.append((f"  {name}", (
            f"weight {f['weight']:.3g}, target {100 * f.get('target', f['weight']):.2f}% of the "
            f"tokens: {f['planned_samples']:,} of {f['samples']:,} samples{pieces} (x"
            f"{f['repeat']:.2f}), {f['planned_tokens']:,} tokens; steps {100 * sh['min']:.1f} .. "
            f"{100 * sh['max']:.1f}%, mean {100 * sh['mean']:.2f}%, error mean "
            f"{points(sh['error'])}, max {points(sh['error_max'])}; {100 * sh['held']:.1f}% of "
            f"the steps within {points(m['tolerance'])}"
        )))  # fmt: skip
    rows.append(("", held_text(m).removeprefix("; ")))
    return rows
