"""``varpack sort`` end to end: under ``mpiexec -n 1..4`` and as a plain single process.

The sorts under mpiexec that succeed (or fail on input the ranks agree about) are made up front,
one MPI job per rank count (``tests/mpi_batch.py``: a rank's start-up costs more than these
sorts); each test then checks its own. A bad shard that one rank meets, and the ``mpirun`` entry,
keep their own launches.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mpi_batch import Case, Ran, mpiexec_many
from testkit import BIN, cli, mpiexec, write_metadata, write_shards

from varpack.fingerprint import fingerprint
from varpack.metadata.contract import read_metadata
from varpack.sort import read_single_file, read_sorted

pytestmark = pytest.mark.mpi


def _reference(input_dir: Path, keys: list[str], descending: list[str]) -> pl.DataFrame:
    order = [*keys, "sample_id"]
    df = pl.from_arrow(read_metadata(input_dir, [k for k in keys if k != "seq_len"]))
    return df.sort(order, descending=[k in descending for k in order])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """Shards of uneven sizes (some empty, several row groups), ids shuffled, lengths skewed."""
    rng = np.random.default_rng(7)
    n = 20_000
    ids = rng.permutation(5 * n)[:n]
    lens = np.minimum(rng.lognormal(5, 1.2, n).astype(np.int64) + 1, 32768)
    root = tmp_path_factory.mktemp("meta")
    write_shards(root, ids, lens, [7000, 0, 1, 10000, 0, 2999])
    write_metadata(
        root / "zz-groups.parquet", [10**9 + i for i in range(1000)], [5] * 1000, row_group_size=97
    )
    return root


MESSAGE = "VARPACK_SORT_MAX_MESSAGE"


@pytest.fixture(scope="module")
def runs(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Case, Ran]]:
    """Every sort of this module that shares a job, by name: its case and what it gave."""
    top = tmp_path_factory.mktemp("sorts")
    cases: dict[str, Case] = {}
    for ranks in (1, 2, 3, 4):
        cases[f"parts{ranks}"] = (ranks, ["sort", dataset, top / f"parts{ranks}" / "sorted"])
        # with 3 and 4 ranks, messages and writes cut into 4000-byte rounds (the large-count path)
        env = {MESSAGE: "4000"} if ranks >= 3 else {}
        out = top / "single" / f"sorted-{ranks}.bin"
        cases[f"single{ranks}"] = (ranks, ["sort", dataset, out, "--single-file", "--quiet"], env)
    rng = np.random.default_rng(12345)  # the seed of the tests' ``rng``
    n = 6000
    ids = rng.choice(2**62, n, replace=False)
    lens = rng.integers(1, 50, n)
    score = rng.normal(size=n).round(2)
    score[:10] = -0.0
    src = write_shards(top / "wide" / "in", ids, lens, [2500, 0, 3500], score=score)
    cases["wide"] = (3, ["sort", src, top / "wide" / "sorted", "--key", "score", "--key",
                         "seq_len", "--descending", "score"], {MESSAGE: "48"})  # fmt: skip
    rng = np.random.default_rng(12345)
    n = 40_000
    lens = np.where(rng.random(n) < 0.9, rng.choice([128, 512, 2048], n), rng.integers(1, 4096, n))
    src = write_shards(top / "heavy" / "in", rng.permutation(n), lens, [n // 2, n // 4, n // 4])
    cases["heavy"] = (4, ["sort", src, top / "heavy" / "sorted", "--descending", "seq_len",
                          "--quiet"])  # fmt: skip
    src = write_metadata(top / "few" / "in.parquet", [9, 4], [3, 3])
    cases["few"] = (3, ["sort", src, top / "few" / "sorted", "--quiet"])
    write_metadata(top / "dup" / "in" / "a.parquet", [1, 2, 3], [5, 5, 5])
    write_metadata(top / "dup" / "in" / "b.parquet", [4, 2, 6], [5, 5, 5])
    cases["dup"] = (2, ["sort", top / "dup" / "in", top / "dup" / "out"])
    got = mpiexec_many(list(cases.values()), top / "jobs")
    return {name: (case, ran) for (name, case), ran in zip(cases.items(), got, strict=True)}


def _ok(got: Ran) -> Ran:
    """A run that must succeed (as ``testkit.mpiexec`` checks it)."""
    assert got.returncode == 0, f"rc={got.returncode}\nstdout:\n{got.stdout}\nstderr:\n{got.stderr}"
    return got


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_parts_match_reference_sort(runs, dataset, ranks):
    (_, (_, _, out)), proc = runs[f"parts{ranks}"]
    _ok(proc)
    assert "sort: write" in proc.stderr and "rows/s" in proc.stderr
    table, index = read_sorted(out)
    ref = _reference(dataset, ["seq_len"], [])
    assert table.column("sample_id").to_pylist() == ref["sample_id"].to_list()
    assert table.column("seq_len").to_pylist() == ref["seq_len"].to_list()
    assert [p["file"] for p in index["parts"]] == [f"part-{r:05d}.parquet" for r in range(ranks)]
    rows = [p["rows"] for p in index["parts"]]
    assert (
        max(rows) <= 1.10 * np.mean(rows)
        and index["balance"]["after_exchange_max_over_mean"] <= 1.10
    )
    fp = fingerprint(ref["sample_id"].to_numpy(), ref["seq_len"].to_numpy())
    assert index["fingerprint"] == fp.hex and index["total_tokens"] == fp.tokens
    assert index["num_rows"] == len(ref) and not list(Path(out).parent.glob(".*tmp*"))


def test_single_file_is_byte_identical_for_every_rank_count(runs, dataset):
    files = []
    for ranks in (1, 2, 3, 4):
        (_, (_, _, out, *_), env), proc = runs[f"single{ranks}"]
        assert (MESSAGE in env) == (ranks >= 3)
        _ok(proc)
        files.append(Path(out).read_bytes())
    assert all(f == files[0] for f in files[1:])
    rec = read_single_file(runs["single1"][0][1][2])
    ref = _reference(dataset, ["seq_len"], [])
    assert rec["sample_id"].tolist() == ref["sample_id"].to_list()


def test_multi_key_descending_wide_keys(runs):
    """A float key + an int key + large ids need several key words (the byte-string path)."""
    (_, (_, src, out, *_), _), proc = runs["wide"]
    _ok(proc)
    assert "B keys" in proc.stderr and "(8 B keys" not in proc.stderr
    table, index = read_sorted(out)
    ref = _reference(src, ["score", "seq_len"], ["score"])
    assert table.column("sample_id").to_pylist() == ref["sample_id"].to_list()
    assert table.column("score").to_pylist() == ref["score"].to_list()
    assert index["columns"] == {"sample_id": "int64", "seq_len": "int64", "score": "float64"}
    # seq_len is not a key here: it travels as payload and must follow its sample
    assert table.column("seq_len").to_pylist() == ref["seq_len"].to_list()


def test_duplicate_heavy_lengths_stay_balanced(runs):
    (_, (_, src, out, *_)), proc = runs["heavy"]
    _ok(proc)
    table, index = read_sorted(out)
    assert index["balance"]["after_exchange_max_over_mean"] <= 1.10
    rows = [p["rows"] for p in index["parts"]]
    assert max(rows) - min(rows) <= 1
    ref = _reference(src, ["seq_len"], ["seq_len"])
    assert table.column("sample_id").to_pylist() == ref["sample_id"].to_list()


def test_more_ranks_than_rows(runs):
    (_, (_, _, out, _)), proc = runs["few"]
    _ok(proc)
    table, index = read_sorted(out)
    assert table.column("sample_id").to_pylist() == [4, 9]
    assert [p["rows"] for p in index["parts"]] == [0, 1, 1]


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_bad_shard_on_one_rank_stops_all_ranks(tmp_path, rng, ranks):
    n = 3000
    src = write_shards(
        tmp_path / "in", rng.permutation(n), rng.integers(1, 100, n), [1000, 1000, 1000]
    )
    # the last shard (read by the last rank only) gets a negative length
    bad = pq.read_table(src / "shard-002.parquet").to_pydict()
    bad["seq_len"][500] = -4
    pq.write_table(pa.table(bad), src / "shard-002.parquet")
    out = tmp_path / "sorted"
    start = time.monotonic()
    proc = mpiexec(ranks, "sort", src, out, timeout=60, check=False)
    assert time.monotonic() - start < 30
    assert proc.returncode == 2
    assert f"rank {ranks - 1}: " in proc.stderr and "shard-002.parquet: row 500" in proc.stderr
    assert "non-positive seq_len" in proc.stderr
    assert "MPI_Abort" not in proc.stderr  # an agreed failure exits cleanly, no abort noise
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_duplicate_ids_across_ranks_are_named(runs):
    (_, (_, src, out)), proc = runs["dup"]
    assert proc.returncode != 0
    assert "duplicate sample_id 2" in proc.stderr
    assert "a.parquet row 1" in proc.stderr and "b.parquet row 1" in proc.stderr
    assert not Path(out).exists() and sorted(p.name for p in Path(out).parent.iterdir()) == ["in"]


def test_single_process_cli_and_overwrite(dataset, tmp_path):
    out = tmp_path / "sorted"
    cli("sort", dataset, out, "--quiet")
    first = json.loads((out / "_index.json").read_text())
    again = cli("sort", dataset, out, expect=2)
    assert "already exists" in again.stderr and "--overwrite" in again.stderr
    res = cli("sort", dataset, out, "--overwrite")
    assert "sort: read" in res.stderr
    assert json.loads((out / "_index.json").read_text()) == first
    table, _ = read_sorted(out)
    assert (
        table.column("sample_id").to_pylist()
        == _reference(dataset, ["seq_len"], [])["sample_id"].to_list()
    )
    bad = cli("sort", dataset, tmp_path / "x", "--descending", "score", expect=2)
    assert "--descending score is not a sort key" in bad.stderr
    missing = cli("sort", tmp_path / "nope", tmp_path / "y", expect=2)
    assert "no such file" in missing.stderr and not (tmp_path / "y").exists()
    assert not list(tmp_path.glob(".*tmp*"))


def test_mpirun_job_entry_matches_single_process(dataset, tmp_path):
    """jobs/sort_metadata.py (the mpirun entry) writes the same single file as `varpack sort`."""
    exe = shutil.which("mpiexec", path=str(BIN))
    job = Path(__file__).parents[2] / "jobs" / "sort_metadata.py"
    cmd = [
        exe,
        "-n",
        "2",
        sys.executable,
        "-m",
        "mpi4py",
        str(job),
        str(dataset),
        str(tmp_path / "a.bin"),
        "--single-file",
        "-q",
    ]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    cli("sort", dataset, tmp_path / "b.bin", "--single-file", "--quiet")
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
