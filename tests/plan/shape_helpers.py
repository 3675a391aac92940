"""What the shape tests share: a plan made by the real planner and written, each rank's written
rows read back as arrays, and a static-shape trainer's replay of a rank's shape sequence."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from varpack.plan import PlanConfig, make_plan
from varpack.planfile.format import load_plan, write_plan
from varpack.planfile.tables import plan_tables


def planned(tmp: Path, ids, lens, cfg: PlanConfig) -> Path:
    """``tmp/plan``: the plan of ``(ids, lens)`` under ``cfg``, made and written as the CLI does."""
    arrays, meta, extra = make_plan(np.asarray(ids), np.asarray(lens), cfg)
    out = tmp / "plan"
    write_plan(out, meta, plan_tables(arrays), rank_extra=extra)
    return out


def manifests(plan: Path) -> list[dict[str, np.ndarray]]:
    """Each rank's rows as arrays: step, counts, pad_to, rows of the shape, warmup, lists."""
    p = load_plan(plan, verify=True)
    cfg = p.meta["config"]
    out = []
    for r in range(p.dp):
        t = p.rank_table(r)
        n = np.array([len(x) for x in t.column("sample_ids").to_pylist()])
        pad_rows = (
            np.array(t.column("pad_rows").to_pylist())
            if "pad_rows" in t.column_names
            else np.zeros(len(n), int)
        )
        if cfg["batching"] == "blocks":
            rows = np.full(len(n), cfg["blocks_per_batch"])
        elif cfg["layout"] == "padded":
            rows = n + pad_rows
        else:
            rows = np.ones(len(n), int)
        out.append(
            {
                "step": np.array(t.column("step").to_pylist()),
                "count": n,
                "pad_to": np.array(t.column("pad_to").to_pylist()),
                "rows": rows,
                "pad_rows": pad_rows,
                "warmup": np.array(t.column("warmup").to_pylist(), bool),
                "seq_lens": t.column("seq_lens").to_pylist(),
                "block_index": t.column("block_index").to_pylist()
                if "block_index" in t.column_names
                else None,
            }
        )
    return out


def compiles_after_prefix(rows: np.ndarray, pad_to: np.ndarray, warmup: np.ndarray) -> list[int]:
    """Simulate a static-shape trainer: positions where a never-seen shape appears after warm-up."""
    seen: set[tuple[int, int]] = set()
    late = []
    for i, shape in enumerate(zip(rows.tolist(), pad_to.tolist(), strict=True)):
        if shape not in seen and not warmup[i]:
            late.append(i)
        seen.add(shape)
    return late
