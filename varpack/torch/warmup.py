"""Compile warm-up: run every shape a rank will see once, before training starts.

With ``torch.compile(dynamic=False)`` each distinct input shape compiles its own graph. A rank that
meets a new shape late recompiles mid-training (and stalls every other rank at the next
collective). The plan knows each rank's shapes in advance (plan.json's per-rank ``shapes`` when the
planner recorded them, else the manifest itself), so :func:`compile_warmup` runs one forward and
backward per shape, largest first (an out-of-memory shows at once), then zeroes the gradients. The
optimizer is never touched, the RNG state is restored, and under DDP the passes run in
``no_sync()`` (ranks may have different numbers of shapes, so no collective may run).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from varpack.planfile.format import Plan, load_plan
from varpack.torch.batch import BlockBatch, PackedBatch, PaddedBatch
from varpack.torch.collate import RowInfo, collate
from varpack.torch.loader import ManifestRows, PlanLoader, plan_layout

Shape = tuple[int, int]


def manifest_shapes(rows: ManifestRows, layout: str) -> list[Shape]:
    """Distinct ``(rows, length)`` shapes of a rank's micro-batches, in order of first appearance.

    packed: ``(1, pad_to)``; padded: ``(samples + pad_rows, pad_to)``; blocks:
    ``(blocks + pad_rows, pad_to)``.
    """
    n = len(rows)
    if n == 0:
        return []
    pad_rows = rows.pad_rows if rows.pad_rows is not None else np.zeros(n, dtype=np.int64)
    if layout == "packed":
        b = np.ones(n, dtype=np.int64)
    elif layout == "padded":
        b = np.diff(rows.ids_off) + pad_rows
    elif layout == "blocks":
        if not rows.has_blocks:
            raise ValueError("a blocks layout needs the plan's block_index column")
        counts = np.diff(rows.block_off)
        b = np.zeros(n, dtype=np.int64)
        nonempty = np.asarray(counts > 0)
        if nonempty.any():  # blocks in a row = its largest block index + 1
            b[nonempty] = np.maximum.reduceat(rows.block, rows.block_off[:-1][nonempty]) + 1
        b = b + pad_rows
    else:
        raise ValueError(f"unknown layout {layout!r}")
    pairs = np.stack([b.astype(np.int64), rows.pad_to.astype(np.int64)], axis=1)
    _, first = np.unique(pairs, axis=0, return_index=True)
    return [(int(pairs[i, 0]), int(pairs[i, 1])) for i in np.sort(first)]


def _parse_shape(item: Any) -> Shape:
    if isinstance(item, int):
        return (1, item)
    if isinstance(item, dict):
        b = next((item[k] for k in ("B", "rows", "batch", "batch_size") if k in item), 1)
        t = next(item[k] for k in ("T", "len", "length", "pad_to", "tokens") if k in item)
        return (int(b), int(t))
    if isinstance(item, (list, tuple)) and len(item) == 2:
        return (int(item[0]), int(item[1]))
    raise ValueError(f"unrecognised shape entry {item!r}")


def recorded_shapes(meta: dict[str, Any], rank: int) -> list[Shape] | None:
    """The rank's shapes as plan.json records them, or ``None``.

    Accepted forms: ``ranks[r]["shapes"]``; ``shapes`` as a list with one list per rank, as a
    dict keyed by rank, or as a list of ``{"rank": r, "shapes": [...]}``. A shape is ``[B, T]``,
    ``{"B": .., "T": ..}`` or an int (a packed length).
    """
    try:
        ranks = meta.get("ranks") or []
        found: Any = ranks[rank].get("shapes") if rank < len(ranks) else None
        shapes = meta.get("shapes")
        if found is None and isinstance(shapes, dict):
            found = shapes.get(str(rank), shapes.get("per_rank", shapes.get("ranks")))
            if (
                isinstance(found, list)
                and len(found) == len(ranks)
                and all(isinstance(x, list) for x in found)
            ):
                found = found[rank]
        elif found is None and isinstance(shapes, list) and shapes:
            if all(isinstance(x, dict) and "rank" in x for x in shapes):
                found = next(x["shapes"] for x in shapes if x["rank"] == rank)
            elif len(shapes) == len(ranks) and all(
                isinstance(x, list) and (not x or not isinstance(x[0], int)) for x in shapes
            ):
                found = shapes[rank]
        return [_parse_shape(s) for s in found] if isinstance(found, list) else None
    except (ValueError, KeyError, StopIteration, TypeError, IndexError, AttributeError):
        return None


def rank_shapes(
    plan: Plan | PlanLoader | str | os.PathLike[str], rank: int, layout: str | None = None
) -> list[Shape]:
    """Shapes this rank will see: plan.json's record if present, else derived from the manifest.

    The manifest is the source of truth; a record that disagrees with it is ignored.
    """
    if isinstance(plan, PlanLoader):
        layout, rows, plan = layout or plan.layout, plan.rows, plan.plan
    else:
        plan = plan if isinstance(plan, Plan) else load_plan(plan, verify=False)
        layout = layout or plan_layout(plan) or "packed"
        rows = ManifestRows(plan.rank_table(rank))
    derived = manifest_shapes(rows, layout)
    recorded = recorded_shapes(plan.meta, rank)
    return recorded if recorded is not None and set(recorded) == set(derived) else derived


def raise_recompile_limit(num_shapes: int) -> None:
    """Let dynamo keep one graph per shape (its default limit is 8 per code object)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < num_shapes + 2:
            setattr(cfg, name, num_shapes + 2)
    if (
        hasattr(cfg, "accumulated_recompile_limit")
        and cfg.accumulated_recompile_limit < 4 * num_shapes
    ):
        cfg.accumulated_recompile_limit = 4 * num_shapes


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (every recompilation adds one).

    The difference before and after a stretch of training is its number of recompilations.
    """
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_warmup(
    model: torch.nn.Module,
    plan: Plan | PlanLoader | str | os.PathLike[str],
    rank: int,
    make_inputs: Callable[[Shape], Any],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    layout: str | None = None,
    shapes: Sequence[Shape] | None = None,
) -> list[Shape]:
    """Forward + backward once per shape of ``rank`` (largest first), then zero the gradients.

    ``make_inputs(shape)`` builds inputs of that shape (e.g. :func:`dummy_batch`), and
    ``loss_fn(model, inputs)`` returns a scalar loss. Returns the shapes run, in order.
    """
    todo = list(shapes) if shapes is not None else rank_shapes(plan, rank, layout)
    todo.sort(key=lambda s: (-s[0] * s[1], -s[1]))
    raise_recompile_limit(len(todo))
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    no_sync = getattr(model, "no_sync", None)
    with no_sync() if callable(no_sync) else contextlib.nullcontext():
        for shape in todo:
            loss = loss_fn(model, make_inputs(shape))
            loss.backward()
    model.zero_grad(set_to_none=True)
    torch.set_rng_state(cpu_rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)
    return todo


def dummy_batch(
    shape: Shape, layout: str = "packed", vocab_size: int = 2
) -> PackedBatch | PaddedBatch | BlockBatch:
    """A batch of ``shape`` built by the loader's own collate (same dtypes, strides and fields).

    Padded: one full-length sample per row. Packed and blocks: two samples per row (when the row
    has 2 tokens or more), so ``cu_seqlens`` has the form of a real batch's: a compiled model sees
    at warm-up what it will see later, and a kernel that slices ``cu_seqlens`` does not specialise
    on a single segment. Token ids are zero (``vocab_size`` is kept for compatibility).
    """
    b, t = shape
    per_row = 2 if layout != "padded" and t >= 2 else 1
    row_lens = [t // 2, t - t // 2] if per_row == 2 else [t]
    lens = np.tile(np.asarray(row_lens, dtype=np.int64), b)
    n = len(lens)
    block_index = np.repeat(np.arange(b, dtype=np.int32), per_row) if layout == "blocks" else None
    row = RowInfo(
        step=0, micro=0, sample_ids=np.arange(n, dtype=np.int64), seq_lens=lens, pad_to=t,
        lr_factor=1.0, step_tokens=int(lens.sum()), step_samples=n, warmup=True,
        is_last_micro=True, block_index=block_index,
    )  # fmt: skip

    def fetch(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(int(lens.sum()), dtype=np.int64), lens

    return collate(row, fetch, layout)
