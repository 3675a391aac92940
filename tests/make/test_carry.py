"""`varpack plan --carry COL`: metadata columns in the manifests, plan.json, validate, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testkit import cli, write_metadata, write_shards

from varpack.make.carry import carry_columns
from varpack.planfile.format import load_plan
from varpack.validate import validate_plan

SOURCES = np.array(["web", "code", "books", "wiki"])
OPTS = ["--max-tokens", 1024, "--dp", 3, "--grad-accum", 2]


def _meta(root: Path, rng: np.random.Generator, n: int = 600) -> dict[str, np.ndarray]:
    cols = {
        "sample_id": rng.permutation(n * 4)[:n].astype(np.int64) * 3 + 1,
        "seq_len": rng.integers(1, 700, n),
        "source": SOURCES[rng.integers(0, len(SOURCES), n)],
        "quality": rng.random(n),
        "lang": rng.integers(-5, 5, n).astype(np.int16),
        "flag": rng.random(n) < 0.3,
    }
    extra = {k: v for k, v in cols.items() if k not in ("sample_id", "seq_len")}
    write_shards(root, cols["sample_id"], cols["seq_len"], [n // 3, 0, n - n // 3], **extra)
    return cols


def _carried(plan: Path, name: str) -> tuple[np.ndarray, list[object]]:
    """Every rank's (sample ids, carried values), flattened."""
    ids: list[int] = []
    values: list[object] = []
    for rank in range(load_plan(plan).dp):
        t = pq.read_table(plan / f"rank-{rank:05d}.parquet")
        ids += t.column("sample_ids").combine_chunks().flatten().to_pylist()
        values += t.column(f"carry.{name}").combine_chunks().flatten().to_pylist()
    return np.array(ids), values


def _expected(cols: dict[str, np.ndarray], name: str, ids: np.ndarray) -> list[object]:
    lookup = dict(zip(cols["sample_id"].tolist(), cols[name].tolist(), strict=True))
    return [lookup[i] for i in ids.tolist()]


def test_raw_metadata_input_carries_every_column(tmp_path, rng):
    cols = _meta(tmp_path / "meta", rng)
    out = tmp_path / "plan"
    args = [f"--carry={c}" for c in ("source", "quality", "lang", "flag")]
    cli("plan", tmp_path / "meta", out, *OPTS, *args)
    meta = json.loads((out / "plan.json").read_text())
    assert meta["carry"]["columns"] == [
        {"name": "source", "type": "string"},
        {"name": "quality", "type": "float64"},
        {"name": "lang", "type": "int64"},
        {"name": "flag", "type": "bool"},
    ]
    for name in ("source", "quality", "lang", "flag"):
        ids, values = _carried(out, name)
        assert len(ids) == len(cols["sample_id"])
        assert values == _expected(cols, name, ids)
    assert (
        "carried source, quality, lang, flag (checked"
        in cli("validate", out, "--metadata", tmp_path / "meta").stdout
    )
    report = validate_plan(out, carry_source=tmp_path / "meta")
    assert report.problems == [] and report.facts["carried"][0] == "source"
    shown = cli("inspect", out).stdout
    assert "source (string), quality (float64), lang (int64), flag (bool) from " in shown


def test_sorted_input_needs_carry_from(tmp_path, rng):
    cols = _meta(tmp_path / "meta", rng)
    cli("sort", tmp_path / "meta", tmp_path / "sorted", "-q")
    bad = cli("plan", tmp_path / "sorted", tmp_path / "p", *OPTS, "--carry", "source", expect=2)
    assert "add --carry-from PATH" in bad.stderr and "varpack lengths --keep source" in bad.stderr
    assert not (tmp_path / "p").exists()
    cli("plan", tmp_path / "sorted", tmp_path / "p", *OPTS, "--carry", "source",
        "--carry-from", tmp_path / "meta")  # fmt: skip
    ids, values = _carried(tmp_path / "p", "source")
    assert values == _expected(cols, "source", ids)
    # the same plan as from the raw metadata: the carried columns do not depend on the route
    cli("plan", tmp_path / "meta", tmp_path / "q", *OPTS, "--carry", "source")
    for rank in range(3):
        name = f"rank-{rank:05d}.parquet"
        assert (tmp_path / "p" / name).read_bytes() == (tmp_path / "q" / name).read_bytes()
    ok = cli("validate", tmp_path / "p", "--metadata", tmp_path / "sorted")
    assert "not checked" in ok.stdout
    ok = cli("validate", tmp_path / "p", "--metadata", tmp_path / "sorted", "--carry-from",
             tmp_path / "meta")  # fmt: skip
    assert "(checked against the metadata)" in ok.stdout


def test_config_file_and_determinism(tmp_path, rng):
    _meta(tmp_path / "meta", rng)
    (tmp_path / "plan.toml").write_text('max_tokens = 1024\ndp = 3\ncarry = ["source", "lang"]\n')
    cli("plan", tmp_path / "meta", tmp_path / "a", "--config", tmp_path / "plan.toml")
    cli("plan", tmp_path / "meta", tmp_path / "b", "--config", tmp_path / "plan.toml")
    a, b = tmp_path / "a", tmp_path / "b"
    assert [p.read_bytes() for p in sorted(a.iterdir())] == [
        p.read_bytes() for p in sorted(b.iterdir())
    ]
    assert [c["name"] for c in load_plan(a).meta["carry"]["columns"]] == ["source", "lang"]
    (tmp_path / "bad.toml").write_text('max_tokens = 1024\ncarry = "source"\n')
    bad = cli(
        "plan", tmp_path / "meta", tmp_path / "c", "--config", tmp_path / "bad.toml", expect=2
    )
    assert "carry must be a list" in bad.stderr


def test_plan_without_carry_has_no_carry_key(tmp_path, rng):
    _meta(tmp_path / "meta", rng)
    cli("plan", tmp_path / "meta", tmp_path / "p", *OPTS)
    meta = load_plan(tmp_path / "p").meta
    assert "carry" not in meta
    assert "carried" not in cli("inspect", tmp_path / "p").stdout
    t = pq.read_table(tmp_path / "p" / "rank-00000.parquet")
    assert not [c for c in t.column_names if c.startswith("carry.")]


def _refused(tmp_path: Path, *args: object) -> str:
    res = cli("plan", tmp_path / "meta", tmp_path / "out", *OPTS, *args, expect=2)
    assert not (tmp_path / "out").exists()
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("varpack: error: ")
    return lines[0]


def test_errors_are_one_line_and_write_nothing(tmp_path, rng):
    cols = _meta(tmp_path / "meta", rng)
    line = _refused(tmp_path, "--carry", "nope")
    assert "--carry nope: no such column" in line and "source, quality" in line
    assert "given twice" in _refused(tmp_path, "--carry", "source", "--carry", "source")
    assert "already holds it" in _refused(tmp_path, "--carry", "seq_len")
    assert "needs --carry" in _refused(tmp_path, "--carry-from", tmp_path / "meta")
    # nested types are refused
    n = len(cols["sample_id"])
    write_metadata(tmp_path / "nested" / "a.parquet", cols["sample_id"], cols["seq_len"],
                   tags=pa.array([[1, 2]] * n))  # fmt: skip
    line = _refused(tmp_path, "--carry", "tags", "--carry-from", tmp_path / "nested")
    assert "a nested type" in line and "list<" in line
    # nulls: how many and the first id
    src = cols["source"].astype(object)
    src[[5, 9]] = None
    write_metadata(tmp_path / "nulls" / "a.parquet", cols["sample_id"], cols["seq_len"],
                   source=pa.array(src.tolist(), pa.string()))  # fmt: skip
    line = _refused(tmp_path, "--carry", "source", "--carry-from", tmp_path / "nulls")
    assert "2 null(s)" in line and f"sample_id {cols['sample_id'][5]}" in line
    # a planned id missing from the metadata
    keep = slice(3, None)
    write_metadata(tmp_path / "part" / "a.parquet", cols["sample_id"][keep], cols["seq_len"][keep],
                   source=cols["source"][keep])  # fmt: skip
    line = _refused(tmp_path, "--carry", "source", "--carry-from", tmp_path / "part")
    assert "(and 2 more) is not in the metadata" in line


def test_validate_catches_a_tampered_carried_value(tmp_path, rng):
    cols = _meta(tmp_path / "meta", rng)
    out = tmp_path / "plan"
    cli("plan", tmp_path / "meta", out, *OPTS, "--carry", "source")
    src = cols["source"].astype(object)
    src[0] = "tampered"
    write_shards(tmp_path / "other", cols["sample_id"], cols["seq_len"], [len(src)], source=src)
    bad = cli("validate", out, "--carry-from", tmp_path / "other", expect=1)
    assert f"sample {cols['sample_id'][0]} carries carry.source" in bad.stdout
    assert "'tampered'" in bad.stdout and "step" in bad.stdout
    # a changed manifest: its checksum and the carried value
    path = out / "rank-00001.parquet"
    t = pq.read_table(path)
    flat = t.column("carry.source").combine_chunks()
    values = flat.flatten().to_pylist()
    values[0] = "other"
    arr = pa.ListArray.from_arrays(flat.offsets, pa.array(values, pa.string()))
    pq.write_table(t.set_column(t.column_names.index("carry.source"), "carry.source", arr), path)
    problems = validate_plan(out, carry_source=tmp_path / "meta").problems
    assert any("sha256" in p for p in problems)
    assert any("carries carry.source 'other'" in p for p in problems)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(0, 2**40), min_size=1, max_size=200, unique=True),
    st.integers(1, 50),
    st.randoms(use_true_random=False),
)
def test_join_aligns_values_with_any_ids(tmp_path_factory, meta_ids, extra, rnd):
    """Random ids, repeated planned ids, extra metadata rows: each value is its id's."""
    root = tmp_path_factory.mktemp("join")
    ids = np.array(meta_ids, dtype=np.int64)
    values = np.array([rnd.randint(-(10**9), 10**9) for _ in ids])
    names = np.array([f"s{v % 7}" for v in values])
    write_metadata(root / "a.parquet", ids, np.ones(len(ids), np.int64), v=values, s=names)
    planned = np.array([rnd.choice(meta_ids) for _ in range(extra)], dtype=np.int64)
    got = carry_columns(root, ["v", "s"], planned)
    lookup = dict(zip(meta_ids, values.tolist(), strict=True))
    rows = np.arange(len(planned))
    assert got.column(0, rows).to_pylist() == [lookup[i] for i in planned.tolist()]
    assert got.column(1, rows).to_pylist() == [f"s{lookup[i] % 7}" for i in planned.tolist()]


@pytest.mark.parametrize("layout", [["--layout", "padded"], ["--batching", "blocks",
    "--block-len", 1024, "--blocks-per-batch", 2], ["--order", "shuffle", "--epochs", 2]])  # fmt: skip
def test_every_layout_carries_and_validates(tmp_path, rng, layout):
    cols = _meta(tmp_path / "meta", rng)
    opts = ["--dp", 2] + ([] if "--batching" in layout else ["--max-tokens", 2048])
    cli("plan", tmp_path / "meta", tmp_path / "p", *opts, *layout, "--carry", "source")
    ids, values = _carried(tmp_path / "p", "source")
    assert values == _expected(cols, "source", ids)
    assert validate_plan(tmp_path / "p", carry_source=tmp_path / "meta").problems == []
