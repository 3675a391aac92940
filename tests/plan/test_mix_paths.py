"""Sources by path (``plan --source NAME=PATH``): the same plan as a source column, checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli

PLAN = ("--max-tokens", 4096, "--dp", 2, "--grad-accum", 4, "--order", "shuffle", "-q")


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    """Two sources, each in a directory of its own, and one file holding both with a column."""
    rng = np.random.default_rng(3)
    root = tmp_path / "meta"
    parts = {"code": (np.arange(0, 3000), rng.integers(50, 800, 3000)),
             "chat": (np.arange(3000, 9000), rng.lognormal(5.5, 0.8, 6000).astype(int).clip(1, 4096))}  # fmt: skip
    for name, (ids, lens) in parts.items():
        (root / name).mkdir(parents=True)
        pq.write_table(pa.table({"sample_id": ids, "seq_len": lens}), root / name / "0.parquet")
    ids = np.concatenate([p[0] for p in parts.values()])
    lens = np.concatenate([p[1] for p in parts.values()])
    src = np.repeat(list(parts), [len(p[0]) for p in parts.values()])
    pq.write_table(pa.table({"sample_id": ids, "seq_len": lens, "source": src}),
                   tmp_path / "one.parquet")  # fmt: skip
    return root


def test_sources_by_path_plan_as_a_source_column(tmp_path: Path, meta: Path) -> None:
    mix = ("--mix", "code=0.4,chat=0.6")
    by_path = ("--source", f"code={meta / 'code'}", "--source", f"chat={meta / 'chat'}")
    cli("plan", meta, tmp_path / "paths", *PLAN, *by_path, *mix)
    cli("plan", tmp_path / "one.parquet", tmp_path / "column", *PLAN, "--source-column",
        "source", *mix)  # fmt: skip
    for f in (tmp_path / "column").glob("rank-*.parquet"):  # the same rows, the same sources
        assert pq.read_table(f).equals(pq.read_table(tmp_path / "paths" / f.name)), f.name
    doc = json.loads((tmp_path / "paths" / "plan.json").read_text())
    assert doc["mix"]["paths"] == {"code": str(meta / "code"), "chat": str(meta / "chat")}
    out = cli("validate", tmp_path / "paths", "--metadata", meta).stdout
    assert out.startswith("OK") and "carried source (checked against the metadata)" in out


def test_a_wrong_source_path_is_one_line_and_writes_nothing(tmp_path: Path, meta: Path) -> None:
    for sources, words in [
        ((f"code={meta}", f"chat={meta / 'chat'}"), "holds --source chat="),
        ((f"code={meta / 'code'}", f"chat={meta / 'nope'}"), "no such file or directory"),
        ((f"code={meta / 'code'}", "chat"), "'chat' is not NAME=PATH"),
        ((f"code={meta / 'code'}", f"code={meta / 'chat'}"), "source 'code' named twice"),
    ]:
        args = [a for s in sources for a in ("--source", s)]
        out = cli("plan", meta, tmp_path / "p", *PLAN, *args, "--mix", "code=0.5,chat=0.5",
                  expect=2)  # fmt: skip
        assert len(out.stderr.strip().splitlines()) == 1 and words in out.stderr, out.stderr
        assert not (tmp_path / "p").exists()
    out = cli("plan", meta, tmp_path / "p", *PLAN, "--source", f"code={meta / 'code'}",
              "--mix", "code=0.5,chat=0.5", expect=2)  # fmt: skip
    assert "is under none of the --source paths" in out.stderr, out.stderr
