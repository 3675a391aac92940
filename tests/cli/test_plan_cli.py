"""`varpack plan` end to end: inputs, TOML, determinism, bad options (exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from testkit import cli, mpiexec, write_metadata, write_shards

from varpack.planfile.format import load_plan
from varpack.validate import validate_plan

BASE = ["--max-tokens", 2048, "--dp", 2, "--grad-accum", 2]


@pytest.fixture
def meta(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, np.ndarray, np.ndarray]:
    n = 3000
    ids = rng.permutation(n).astype(np.int64) * 5 + 11
    lens = np.minimum(rng.lognormal(5.5, 1.0, n).astype(np.int64) + 1, 2048)
    root = write_shards(tmp_path / "meta", ids, lens, [1000, 0, 1200, 800])
    return root, ids, lens


def _files(plan: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(plan.iterdir())}


def test_plan_from_metadata_validates(tmp_path, meta):
    root, ids, lens = meta
    out = tmp_path / "plan"
    res = cli("plan", root, out, *BASE, "--cost", "flops", "--model-preset", "qwen2.5-0.5b")
    assert "steps x 2 ranks x 2 micro-batches" in res.stdout
    plan = load_plan(out, verify=True)
    assert plan.meta["input"]["num_samples"] == 3000
    config = plan.meta["config"]  # resolved, defaults and the preset's model included
    assert config["model"]["hidden"] == 896 and config["model_digest"].startswith("sha256:")
    assert plan.meta["config"]["order"] == "curriculum" and plan.meta["layout"]["pp"] == 1
    assert validate_plan(out, (ids, lens)).problems == []
    ok = cli("validate", out, "--metadata", root)
    assert ok.stdout.startswith("OK ")


@pytest.mark.mpi
def test_plan_is_byte_identical_across_runs_and_sort_rank_counts(tmp_path, meta):
    root, _, _ = meta
    opts = [
        *BASE,
        "--order",
        "shuffle",
        "--seed",
        3,
        "--lr-scaling",
        "sqrt",
        "--base-batch-size",
        64,
    ]
    cli("plan", root, tmp_path / "a", *opts)
    cli("plan", root, tmp_path / "b", *opts)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    mpiexec(1, "sort", root, tmp_path / "s1", "--quiet")
    mpiexec(3, "sort", root, tmp_path / "s3", "--quiet")
    cli("plan", tmp_path / "s1", tmp_path / "c", *opts)
    cli("plan", tmp_path / "s3", tmp_path / "d", *opts)
    fa, fc, fd = _files(tmp_path / "a"), _files(tmp_path / "c"), _files(tmp_path / "d")
    for name in fa:
        if name.endswith(".parquet"):
            assert fa[name] == fc[name] == fd[name], name
    docs = [json.loads(f["plan.json"]) for f in (fa, fc, fd)]
    sources = [d["input"].pop("source") for d in docs]
    assert docs[0] == docs[1] == docs[2]
    assert len(set(sources)) == 3
    index = json.loads((tmp_path / "s3" / "_index.json").read_text())
    assert index["fingerprint"] == docs[0]["input"]["fingerprint"]


def test_toml_config_and_flag_override(tmp_path, meta):
    root, _, _ = meta
    toml = tmp_path / "plan.toml"
    toml.write_text(
        'max-tokens = 4096\ndp = 2\ngrad_accum = 3\nlayout = "padded"\npad-multiple = 64\n'
    )
    out = tmp_path / "plan"
    cli("plan", root, out, "--config", toml, "--grad-accum", 2)
    cfg = load_plan(out).meta["config"]
    assert (
        cfg["max_tokens"],
        cfg["dp"],
        cfg["grad_accum"],
        cfg["layout"],
        cfg["pad_multiple"],
    ) == (
        4096,
        2,
        2,
        "padded",
        64,
    )
    assert validate_plan(out).problems == []


def test_oversize_drop_listed(tmp_path):
    write_metadata(tmp_path / "m.parquet", [1, 2, 3, 4, 5], [10, 500, 20, 30, 900])
    out = tmp_path / "plan"
    cli("plan", tmp_path / "m.parquet", out, "--max-tokens", 100, "--oversize", "drop")
    meta = load_plan(out).meta
    assert [d["sample_id"] for d in meta["dropped"]] == [2, 5]
    assert "oversize" in meta["dropped"][0]["reason"]
    assert meta["input"]["num_samples"] == 5
    assert validate_plan(out).problems == []


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--max-tokens", 100, "--dp", 0], "--dp"),
        (["--max-tokens", 100, "--grad-accum", 0], "--grad-accum"),
        (["--max-tokens", 100, "--cost", "flops", "--model-preset", "nope"], "unknown"),
        (["--max-tokens", 100, "--batch-size", 4], "conflicts"),
        ([], "needs --max-tokens"),
        (["--max-tokens", 100, "--dp", 50], "cannot fill one step"),
        (["--max-tokens", 15], "do not fit --max-tokens 15"),
    ],
)
def test_bad_options_exit_2_and_write_nothing(tmp_path, args, match):
    write_metadata(tmp_path / "m.parquet", [1, 2, 3, 4, 5], [10, 20, 20, 30, 16])
    out = tmp_path / "plan"
    res = cli("plan", tmp_path / "m.parquet", out, *args, expect=2)
    assert match in res.stderr and res.stderr.startswith("varpack: error:")
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m.parquet"]


def test_bad_inputs_exit_2(tmp_path):
    write_metadata(tmp_path / "empty.parquet", [], [])
    res = cli("plan", tmp_path / "empty.parquet", tmp_path / "p", "--max-tokens", 8, expect=2)
    assert "no rows" in res.stderr and not (tmp_path / "p").exists()
    res = cli("plan", tmp_path / "missing", tmp_path / "p", "--max-tokens", 8, expect=2)
    assert "no such file" in res.stderr
    toml = tmp_path / "bad.toml"
    toml.write_text("max_tokens = 8\nshuffle = true\n")
    write_metadata(tmp_path / "m.parquet", [1], [3])
    res = cli("plan", tmp_path / "m.parquet", tmp_path / "p", "--config", toml, expect=2)
    assert "unknown option 'shuffle'" in res.stderr and not (tmp_path / "p").exists()


def test_existing_output_needs_overwrite(tmp_path):
    write_metadata(tmp_path / "m.parquet", [1, 2], [3, 4])
    out = tmp_path / "plan"
    cli("plan", tmp_path / "m.parquet", out, "--max-tokens", 8)
    before = _files(out)
    res = cli("plan", tmp_path / "m.parquet", out, "--max-tokens", 4, expect=2)
    assert "--overwrite" in res.stderr and _files(out) == before
    cli("plan", tmp_path / "m.parquet", out, "--max-tokens", 4, "--overwrite")
    assert load_plan(out).meta["config"]["max_tokens"] == 4
