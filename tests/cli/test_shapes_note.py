"""Compile-friendly shapes: the README's flow bounds them, and a plan that does not says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from testkit import cli

FLOW = ("--dp", 2, "--grad-accum", 2, "--max-tokens", 4096, "--oversize", "split", "--order",
        "shuffle", "--seed", 0, "--cost", "flops", "--model-preset", "qwen2.5-0.5b")  # fmt: skip


def text_like(path: Path, n: int = 20_000) -> Path:
    """Lengths shaped like tokenized chat and web text: a log-normal body (median ~300 tokens),
    a heavy tail, and 1 % of documents longer than the 4,096-token budget (split into pieces)."""
    rng = np.random.default_rng(11)
    lens = np.clip(rng.lognormal(np.log(300), 1.1, n), 5, None).astype(np.int64)
    long = rng.random(n) < 0.01
    lens[long] = rng.integers(4097, 30_000, int(long.sum()))
    pq.write_table(pa.table({"sample_id": np.arange(n) * 5 + 2, "seq_len": lens}), path)
    return path


def shapes_per_rank(plan: Path) -> list[int]:
    return [len(r["shapes"]) for r in json.loads((plan / "plan.json").read_text())["ranks"]]


def test_the_readme_flow_bounds_the_shapes_and_an_unbounded_plan_says_so(tmp_path: Path) -> None:
    meta = text_like(tmp_path / "meta.parquet")
    bounded = cli("plan", meta, tmp_path / "p", *FLOW, "--max-shapes", 16)
    assert max(shapes_per_rank(tmp_path / "p")) <= 16 and "note: rank" not in bounded.stderr
    stats = json.loads((tmp_path / "p" / "plan.json").read_text())["stats"]
    assert stats["padding_ratio"] < 0.02  # the price of 16 shapes when packed: about 1 point
    free = cli("plan", meta, tmp_path / "q", *FLOW)
    most = max(shapes_per_rank(tmp_path / "q"))
    assert (
        most > 32 and f"meets {most:,} shapes" in free.stderr and "--max-shapes 16" in free.stderr
    )
