"""``varpack validate`` and ``inspect`` under ``mpiexec -n 1..4``: the one-process output, always.

Each case runs the command in one process (in-process, as the CLI runs it) and under mpiexec,
and compares exit code, stdout and stderr line for line: good plans of several kinds, tampered
plans, and errors that only one rank meets (nothing hangs: every run has a timeout).

The runs under mpiexec are made up front, one MPI job per rank count (``tests/mpi_batch.py``: a
rank's start-up costs far more than these checks); each test then checks its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mpi_batch import Case, Ran, mpiexec_many
from testkit import cli, mpiexec, write_shards

from varpack.planfile.format import PLAN_JSON, _write_table, rank_file, sha256_file

pytestmark = pytest.mark.mpi

BASE = ["--max-tokens", 4096, "--dp", 4, "--grad-accum", 2, "--oversize", "drop", "-q"]
PLANS = {
    "curriculum": ["--max-tokens", 4096, "--dp", 2, "--grad-accum", 3, "--oversize", "drop",
                   "--lr-scaling", "linear", "--base-batch-size", 32, "-q"],
    "shuffle2": [*BASE, "--order", "shuffle", "--epochs", 2],
    "split": ["--max-tokens", 4096, "--dp", 3, "--grad-accum", 2, "--oversize", "split", "-q"],
    "mix": [*BASE, "--mix", "web=0.5,code=0.3,books=0.2", "--source-column", "source"],
    "mixsplit": ["--max-tokens", 4096, "--dp", 2, "--grad-accum", 2, "--oversize", "split",
                 "--mix", "web=0.3,code=0.3,books=0.4", "--source-column", "source", "-q"],
    "carry": [*BASE, "--carry", "source"],
    "reorder2": [*BASE, "--warmup", "reorder", "--epochs", 2, "--layout", "padded",
                 "--max-shapes", 4],
}  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Metadata (a source column, a few documents longer than the budget) and its plans."""
    rng = np.random.default_rng(11)
    n = 3000
    ids = rng.permutation(20 * n)[:n]
    lens = np.where(rng.random(n) < 0.02, rng.integers(4097, 9000, n), rng.integers(1, 1500, n))
    source = rng.choice(np.array(["web", "code", "books"]), n, p=[0.5, 0.3, 0.2])
    top = tmp_path_factory.mktemp("mpi-validate")
    write_shards(top / "meta", ids, lens, [1200, 0, 1800], source=source)
    for name, args in PLANS.items():
        cli("plan", top / "meta", top / name, *args)
    _tamper(top)
    return top


def _tamper(top: Path) -> None:
    """Plans with a sample duplicated across ranks 0 and 3 (checksums rewritten to match), an
    edited rank file (its checksum no longer matches) and a missing and a truncated one."""
    dup = top / "dup"
    shutil.copytree(top / "shuffle2", dup)
    r0, r3 = _rows(dup, 0), _rows(dup, 3)
    for k in range(7):  # seven samples of rank 0 planned again on rank 3
        r3[k]["sample_ids"].append(r0[k]["sample_ids"][0])
        r3[k]["seq_lens"].append(r0[k]["seq_lens"][0])
    _rewrite(dup, 3, r3)
    edited = top / "edited"
    shutil.copytree(top / "curriculum", edited)
    rows = _rows(edited, 1)
    rows[2]["lr_factor"] = 9.0
    _write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(edited / rank_file(1))),
                 edited / rank_file(1))  # fmt: skip
    missing = top / "missing"  # rank 2's file gone, rank 3's truncated: rank 2 is named first
    shutil.copytree(top / "shuffle2", missing)
    (missing / rank_file(2)).unlink()
    data = (missing / rank_file(3)).read_bytes()
    (missing / rank_file(3)).write_bytes(data[: len(data) // 2])


def _rows(plan: Path, rank: int) -> list[dict]:
    return pq.read_table(plan / rank_file(rank)).to_pylist()


def _rewrite(plan: Path, rank: int, rows: list[dict]) -> None:
    """Replace a manifest and update plan.json's checksum and rows (a 'consistent' forgery)."""
    path = plan / rank_file(rank)
    _write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    doc = json.loads((plan / PLAN_JSON).read_text())
    doc["ranks"][rank].update(sha256=sha256_file(path), rows=len(rows))
    (plan / PLAN_JSON).write_text(json.dumps(doc))


#: validate under mpiexec: (plan, ranks, with --metadata, exit code)
VALIDATE = [
    ("curriculum", 1, False, 0),
    ("shuffle2", 2, True, 0),
    ("split", 3, True, 0),
    ("mix", 4, False, 0),
    ("mixsplit", 2, True, 0),  # pieces of drawn documents, checked against the metadata
    ("carry", 2, True, 0),  # carried values checked against the metadata
    ("reorder2", 3, False, 0),
    ("dup", 4, True, 1),
    ("edited", 2, False, 1),
    ("missing", 4, False, 1),  # only rank 2 reads the missing file
]
INSPECT = [("split", 2), ("mix", 3), ("mixsplit", 2), ("missing", 4)]


@pytest.fixture(scope="module")
def runs(root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Case, Ran]]:
    """Every command under mpiexec of this module, by name: its case and what it gave."""
    cases: dict[str, Case] = {}
    for plan, ranks, with_meta, _ in VALIDATE:
        meta = ["--metadata", root / "meta"] if with_meta else []
        cases[f"validate-{plan}"] = (ranks, ["validate", root / plan, *meta])
    for plan, ranks in INSPECT:
        cases[f"inspect-{plan}"] = (ranks, ["inspect", root / plan])
    plot = tmp_path_factory.mktemp("plot")
    cases["plot"] = (3, ["inspect", root / "carry", "--plot", plot / "fig.png", "--json"])
    cases["unreadable"] = (3, ["validate", root / "curriculum", "--metadata", root / "nope"])
    cases["replay"] = (2, ["validate", root / "curriculum", "--metadata", root / "meta",
                           "--replay"])  # fmt: skip
    cases["quiet-ok"] = (2, ["validate", root / "shuffle2", "--metadata", root / "meta", "-q"])
    cases["quiet-dup"] = (3, ["validate", root / "dup", "--quiet"])
    got = mpiexec_many(list(cases.values()), tmp_path_factory.mktemp("jobs"))
    return {name: (case, ran) for (name, case), ran in zip(cases.items(), got, strict=True)}


def _same(runs: dict[str, tuple[Case, Ran]], name: str) -> tuple[int, str, str]:
    """Run the case's ``varpack ARGS`` in one process; it printed the same under mpiexec."""
    (_, args), got = runs[name]
    one = cli(*args, expect=None)
    assert got.seconds < 60
    assert (got.returncode, got.stdout, got.stderr) == (one.exit_code, one.stdout, one.stderr)
    return got.returncode, got.stdout, got.stderr


@pytest.mark.parametrize(("plan", "ranks", "with_meta", "code"), VALIDATE)
def test_validate_under_mpi_prints_what_one_process_prints(
    runs, root, plan, ranks, with_meta, code
):
    rc, out, err = _same(runs, f"validate-{plan}")
    assert rc == code
    if code:
        assert out.startswith("violation: ") and err.strip().endswith(("violation", "violations"))
    else:
        assert out.startswith(f"OK {root / plan}: ") and not err
    if plan == "dup":
        assert "7 sample ids planned more than once" in out and "rank 3 step" in out
        assert "do not match the input fingerprint" in out
    if plan == "missing":
        assert f"{root / plan / rank_file(2)}: rank 2 manifest is missing" in out
        assert f"{root / plan / rank_file(3)}: rank 3 manifest is unreadable" in out
    if plan == "edited":  # a job of its own (ended by Abort, its code through mpiexec): the same
        alone = mpiexec(ranks, "validate", root / plan, check=False, timeout=90)
        assert (alone.returncode, alone.stdout, alone.stderr) == (rc, out, err)


@pytest.mark.parametrize(("plan", "ranks"), INSPECT)
def test_inspect_under_mpi_prints_what_one_process_prints(runs, root, plan, ranks):
    rc, out, err = _same(runs, f"inspect-{plan}")
    if plan == "missing":  # one line, from the one rank that reads the file, exit 2 everywhere
        assert rc == 2 and not out
        assert err.splitlines() == [
            f"varpack: error: {root / plan / rank_file(2)}: rank 2 manifest is missing; "
            "re-run varpack plan"
        ]
    else:
        assert rc == 0 and out.split()[:2] == ["plan", str(root / plan)] and not err


def test_inspect_plot_is_drawn_once(runs, root):
    pytest.importorskip("matplotlib")
    (_, (*_, fig, _)), got = runs["plot"]
    fig = Path(str(fig))
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["plan"] == str(root / "carry") and not got.stderr
    assert fig.is_file() and not [p for p in fig.parent.iterdir() if p != fig]


def test_errors_are_one_line_and_one_code_on_every_rank(runs):
    """A --metadata that cannot be read (rank 0 reads it), and --replay, refused under MPI."""
    rc, out, err = _same(runs, "unreadable")
    assert rc == 2 and not out and len(err.splitlines()) == 1
    got = runs["replay"][1]
    assert got.returncode == 2 and not got.stdout
    assert got.stderr.splitlines() == [
        "varpack: error: --replay plans the whole input again in one process, as varpack plan "
        "does: run varpack validate --replay without mpiexec (every other check runs under it)"
    ]


def test_quiet_under_mpi_says_only_the_violations(runs):
    assert _same(runs, "quiet-ok") == (0, "", "")
    rc, out, err = _same(runs, "quiet-dup")
    assert rc == 1 and out.startswith("violation: ")
    assert "7 sample ids planned more than once" in out


def test_a_second_epoch_holding_extra_samples_is_reported_not_a_crash(root, tmp_path):
    """Samples planned again in the second epoch's last rows: the moved figures (drawn over one
    epoch's samples) are not recomputed, and coverage names the samples planned again."""
    plan = tmp_path / "extra"
    shutil.copytree(root / "shuffle2", plan)
    r0, r3 = _rows(plan, 0), _rows(plan, 3)
    for k in range(1, 8):
        r3[-k]["sample_ids"].append(r0[k]["sample_ids"][0])
        r3[-k]["seq_lens"].append(r0[k]["seq_lens"][0])
    _rewrite(plan, 3, r3)
    out = cli("validate", plan, expect=1)
    assert "Traceback" not in out.stderr + out.stdout
    assert "7 sample ids planned more than once" in out.stdout
