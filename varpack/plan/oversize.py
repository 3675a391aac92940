"""The rules of the oversize options: which combinations hold, the bound of ``--oversize alone``,
and the preview of every choice that ``varpack check --max-tokens`` prints.

``--oversize split`` is supported wherever the greedy batcher packs (``--batching budget``, both
layouts and orders, epochs, grad-accum, ``--max-shapes``, ``--pack-to``, ``--pp`` in the packed
layout; shuffled steps are composed by cost when the pieces fill the budget, the default, and by
tokens with a shorter ``--split-len``, as ``--compose cost`` has no way to keep shorter pieces apart); it is refused with ``--batching blocks``, ``--pp`` in the padded layout, ``--cp`` with
``--cp-batching gds``, whose batchers do not keep the pieces of one document apart.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from varpack.errors import ConfigError
from varpack.plan.kernels.split import alone_volume, fit_len


class Options(Protocol):
    """The options these rules read (a :class:`~varpack.plan.config.PlanConfig`; typed by its
    shape, since the config module calls these rules)."""

    @property
    def oversize(self) -> str: ...
    @property
    def split_len(self) -> int | None: ...
    @property
    def split_positions(self) -> str: ...
    @property
    def max_alone_tokens(self) -> int | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def pad_multiple(self) -> int: ...
    @property
    def batching(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def pp(self) -> int: ...
    @property
    def max_shapes(self) -> int | None: ...
    @property
    def pack_to(self) -> int | None: ...
    @property
    def cp(self) -> int: ...
    @property
    def cp_batching(self) -> str: ...


#: Default bound of a lone micro-batch, in budgets, and the size above which it is a warning.
ALONE_BOUND = 4
ALONE_WARN = 2
_SHOW = 5


def resolve_oversize(cfg: Options) -> int | None:
    """Check the oversize options against the rest; the default split length to fill in
    (``None``: nothing to fill)."""
    if cfg.oversize != "split":
        given = "--split-len" if cfg.split_len is not None else None
        if cfg.split_positions != "restart":
            given = "--split-positions"
        if given:
            raise ConfigError(f"{given} applies to --oversize split only; add --oversize split")
    if cfg.oversize != "alone" and cfg.max_alone_tokens is not None:
        raise ConfigError("--max-alone-tokens applies to --oversize alone only")
    if cfg.oversize in ("alone", "split"):
        what = _conflict(cfg)
        if what:
            why = (
                "a lone oversize sample would need a shape of its own"
                if cfg.oversize == "alone"
                else "its batcher cannot keep the pieces of a document apart"
            )
            raise ConfigError(
                f"--oversize {cfg.oversize} conflicts with {what} ({why}); use --oversize drop "
                "or raise the budget"
            )
    if cfg.oversize == "alone":
        assert cfg.max_tokens is not None
        if cfg.max_alone_tokens is not None and cfg.max_alone_tokens < cfg.max_tokens:
            raise ConfigError(
                f"--max-alone-tokens {cfg.max_alone_tokens} is below --max-tokens "
                f"{cfg.max_tokens}; give a bound of at least the budget"
            )
    if cfg.oversize != "split":
        return None
    assert cfg.max_tokens is not None
    top = fit_len(cfg.max_tokens, cfg.pad_multiple)
    if cfg.split_len is None:
        return top
    if cfg.split_len > top:
        raise ConfigError(
            f"--split-len {cfg.split_len} exceeds {top}, the longest piece that fits --max-tokens "
            f"{cfg.max_tokens} alone; lower --split-len (or leave it out for {top})"
        )
    return None


def _conflict(cfg: Options) -> str | None:
    """The first option that ``--oversize alone`` / ``split`` cannot be combined with."""
    if cfg.batching == "blocks":
        return "--batching blocks"
    if cfg.oversize == "split":
        if cfg.cp > 1 and cfg.cp_batching == "gds":
            return "--cp with --cp-batching gds"
        return "--pp in the padded layout" if cfg.pp > 1 and cfg.layout == "padded" else None
    for flag, on in (
        ("--max-shapes", cfg.max_shapes is not None),
        ("--pack-to", cfg.pack_to is not None),
        ("--pp", cfg.pp > 1),
    ):
        if on:
            return flag
    return None


def alone_bound(cfg: Options) -> int:
    """The largest lone micro-batch ``--oversize alone`` accepts, in tokens."""
    assert cfg.max_tokens is not None
    return cfg.max_alone_tokens or ALONE_BOUND * cfg.max_tokens


def check_alone(ids: np.ndarray, lens: np.ndarray, cfg: Options) -> list[str]:
    """Refuse lone samples above the bound; the warning line for those above 2 x the budget."""
    assert cfg.max_tokens is not None
    vol = alone_volume(lens, cfg.pad_multiple)
    bound = alone_bound(cfg)
    over = np.flatnonzero(vol > bound)
    if len(over):
        how = "" if cfg.max_alone_tokens else f" ({ALONE_BOUND} x --max-tokens {cfg.max_tokens})"
        shown = ", ".join(f"{int(ids[i])} ({int(vol[i]):,} tokens)" for i in over[:_SHOW])
        more = f" and {len(over) - _SHOW} more" if len(over) > _SHOW else ""
        raise ConfigError(
            f"--oversize alone: {len(over)} samples would make micro-batches above "
            f"--max-alone-tokens {bound:,}{how}: sample_id {shown}{more}; split them "
            "(--oversize split), drop them (--oversize drop), or raise --max-alone-tokens"
        )
    big = vol > ALONE_WARN * cfg.max_tokens
    if not big.any():
        return []
    top = int(np.argmax(vol))
    return [
        f"varpack: warning: --oversize alone: {int(big.sum())} micro-batches exceed "
        f"{ALONE_WARN} x --max-tokens {cfg.max_tokens:,}; the largest, sample_id {int(ids[top])}, "
        f"holds {int(vol[top]):,} tokens ({vol[top] / cfg.max_tokens:.1f} x the budget)"
    ]


def preview(
    lens: np.ndarray, max_tokens: int, pad_multiple: int = 1, split_len: int | None = None
) -> dict[str, Any]:
    """What each ``--oversize`` choice would do to documents of ``lens`` under a budget.

    >>> p = preview(np.array([3, 10, 25]), 8)
    >>> p["oversize"]["documents"], p["split"]["pieces"], p["alone"]["largest"]
    (2, 6, 25)
    """
    lens = np.asarray(lens, dtype=np.int64)
    top = fit_len(max_tokens, pad_multiple)
    s = split_len or top
    if s > top:
        raise ConfigError(
            f"--split-len {s} exceeds {top}, the longest piece that fits --max-tokens {max_tokens}"
        )
    over = lens > top
    total = int(lens.sum())
    over_tokens = int(lens[over].sum())
    long = lens[lens > s]
    vol = alone_volume(lens[over], pad_multiple)
    return {
        "max_tokens": max_tokens,
        "total_tokens": total,
        "oversize": {
            "documents": int(over.sum()),
            "tokens": over_tokens,
            "share": over_tokens / total if total else 0.0,
        },
        "split": {
            "split_len": s,
            "documents": len(long),
            "pieces": int((-(-long // s)).sum()),
            "tokens": int(long.sum()),
            "share": float(long.sum()) / total if total else 0.0,
        },
        "alone": {
            "micro_batches": int(over.sum()),
            "largest": int(vol.max()) if len(vol) else 0,
            "above_warning": int((vol > ALONE_WARN * max_tokens).sum()),
            "above_bound": int((vol > ALONE_BOUND * max_tokens).sum()),
        },
    }


def render_preview(p: dict[str, Any]) -> str:
    """The lines ``varpack check --max-tokens`` prints for :func:`preview`."""
    o, sp, al = p["oversize"], p["split"], p["alone"]
    b = p["max_tokens"]
    pct = f"{100 * o['share']:.1f}% of all tokens"
    if not o["documents"] and not sp["documents"]:
        return f"--max-tokens {b:,}: every document fits; --oversize changes nothing"
    lines = [
        f"--max-tokens {b:,}: {o['documents']:,} documents ({o['tokens']:,} tokens, {pct}) do not fit alone",
        "  --oversize error  stops planning and names them",
        f"  --oversize drop   drops {o['documents']:,} documents, {o['tokens']:,} tokens ({pct})",
        f"  --oversize split  splits {sp['documents']:,} documents ({sp['tokens']:,} tokens, "
        f"{100 * sp['share']:.1f}%) into {sp['pieces']:,} pieces of <= {sp['split_len']:,} tokens; keeps 100%",
        f"  --oversize alone  {al['micro_batches']:,} micro-batches alone, the largest {al['largest']:,} "
        f"tokens ({al['largest'] / b:.1f} x the budget); {al['above_warning']:,} above "
        f"{ALONE_WARN} x (warned), {al['above_bound']:,} above {ALONE_BOUND} x (refused by default)",
    ]
    return "\n".join(lines)
