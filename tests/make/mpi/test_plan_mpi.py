"""``varpack plan`` under ``mpiexec -n 1..4``: the one-process plan, byte for byte.

Random inputs (sizes and length shapes the planner was not tuned on) and random option sets are
planned in one process (in-process, as the CLI runs it) and under mpiexec; the plan directories
must hold the same files with the same bytes, and rank 0 must print the same summary. A failure
must be the one-process line, once, with its exit code and nothing left behind.

The runs under mpiexec that need no process of their own are made up front, one MPI job per rank
count for the whole module (``tests/mpi_batch.py``: a rank's start-up costs far more than these
plans); each test then checks its own. The ``Abort`` that carries an agreed failure's exit code
out of mpiexec keeps its own launch; signals, a rank failing while it writes and MPI's shared
memory after a failure: ``test_plan_mpi_faults.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mpi_batch import Case, Ran, mpiexec_many
from testkit import cli, mpiexec, write_shards

pytestmark = pytest.mark.mpi


def _lengths(rng: np.random.Generator, n: int, shape: str, budget: int) -> np.ndarray:
    """Lengths of one of several shapes: long-SFT tail, bimodal, uniform, many ties."""
    if shape == "tail":  # log-normal body, 0.1 % near the budget (some above it)
        body = np.exp(rng.normal(5.5, 1.0, n)).astype(np.int64) + 1
        near = rng.random(n) < 0.001
        return np.where(near, rng.integers(budget // 2, budget + budget // 8, n), body)
    if shape == "bimodal":
        short = rng.integers(16, budget // 8, n)
        long = rng.integers(budget // 2, budget + budget // 16, n)
        return np.where(rng.random(n) < 0.6, short, long)
    if shape == "ties":  # few distinct lengths: ties broken by id everywhere
        return rng.choice(np.array([7, 64, 65, 300, budget - 1]), n)
    return rng.integers(1, budget, n)


def _options(rng: np.random.Generator, budget: int) -> list[object]:
    """A random option set of those plan shares over ranks."""
    args: list[object] = ["--dp", int(rng.integers(1, 9)), "--grad-accum", int(rng.integers(1, 5))]
    if rng.random() < 0.2:
        args += ["--batching", "fixed", "--batch-size", int(rng.integers(1, 24))]
    else:
        oversize = str(rng.choice(["drop", "alone", "split"]))
        args += ["--max-tokens", budget, "--oversize", oversize, "--max-alone-tokens", 4 * budget]
        if oversize == "split" and rng.random() < 0.5:  # pieces shorter than the budget
            args += ["--split-len", int(rng.integers(budget // 16, budget))]
    if rng.random() < 0.4:
        args += ["--layout", "padded", "--pad-multiple", int(rng.choice([1, 8, 64]))]
    cost = str(rng.choice(["tokens", "padded", "flops"]))
    args += ["--cost", cost] + (["--model-preset", "qwen2.5-0.5b"] if cost == "flops" else [])
    args += ["--shuffle-window", int(rng.integers(1, 5)), "--epochs", int(rng.integers(1, 4))]
    args += ["--warmup", str(rng.choice(["list", "none", "reorder"]))]
    shaped = rng.random()
    if shaped < 0.3 and "--batch-size" not in args:  # bounded shapes, chosen over every rank's
        args += ["--max-shapes", int(rng.integers(1, 17))]
    elif shaped < 0.4 and "--batch-size" not in args and "padded" not in args:
        args += ["--pack-to", budget]
    if rng.random() < 0.5:
        args += ["--lr-scaling", "sqrt", "--base-batch-size", float(rng.integers(4, 64))]
    if rng.random() < 0.5:
        args += ["--carry", "source"]
    if (
        "--max-tokens" in args
        and "padded" not in args
        and "split" not in args
        and rng.random() < 0.3
    ):
        args += ["--cp", int(rng.choice([2, 4])), "--bucket-size", budget]  # context parallel
        args += ["--cp-batching", str(rng.choice(["gds", "greedy"]))]
    if rng.random() < 0.5:  # the two shuffle batchers: composed by cost (packed) or by tokens
        compose = "tokens" if "padded" in args or rng.random() < 0.4 else "cost"
        args += ["--order", "shuffle", "--seed", int(rng.integers(0, 99)), "--compose", compose]
    piped = rng.random() < 0.3  # pipeline parallel (packed): a rank's steps padded alike
    if piped and "padded" not in args and "--cp" not in args and "alone" not in args:
        k = args.index("--grad-accum") + 1
        args[k] = 2 * -(-int(args[k]) // 2)  # type: ignore[call-overload]
        args += ["--pp", 2]
    if rng.random() < 0.4 and "--pp" not in args:  # balanced per step (default: per slot)
        args += ["--sync", "step"]
    return args


def _files(plan: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(plan.iterdir())}


def _case(tmp: Path, seed: int) -> tuple[Path, list[object], Case | None]:
    """Metadata of a random size and shape, its sort output (or the mpiexec sort that makes it)
    and a random option set."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([40, 700, 3000, 9000]))
    budget = int(rng.choice([2048, 8192]))
    shape = str(rng.choice(["tail", "bimodal", "uniform", "ties"]))
    ids = rng.permutation(5 * n)[:n]
    lens = _lengths(rng, n, shape, budget)
    source = rng.choice(np.array(["web", "code", "books"]), n)
    meta = tmp / "meta"
    write_shards(meta, ids, lens, [n // 3, 0, n - n // 3], source=source)
    how = seed % 3  # a parts output of one sort rank, of three, or a single file
    sort: Case | None = None
    if how == 1:
        sort = (3, ["sort", meta, tmp / "sorted", "-q"])
    else:
        cli("sort", meta, tmp / "sorted", "-q", *(["--single-file"] if how == 2 else []))
    args = _options(rng, budget)
    if "--carry" in args:
        args += ["--carry-from", meta]
    return tmp / "sorted", args, sort


#: the rank count of each random case, in turn: every count, the uneven splits most (one count per
#: case, as each mpiexec costs a second of start-up per rank; the cases vary the rest)
RANKS = (4, 2, 3, 4, 3, 2, 1, 4)

#: the ``--pp`` option sets (packed): each (step, rank) padded to its largest micro-batch on the
#: rank that holds the step; the warm-up reorder moves whole (step, rank) groups
PIPELINE = [
    ["--grad-accum", 4, "--pp", 2, "--warmup", "reorder", "--oversize", "split", "--dp", 2],
    ["--grad-accum", 2, "--pp", 2, "--warmup", "reorder", "--order", "shuffle", "--seed", 5],
    ["--grad-accum", 4, "--pp", 4, "--order", "shuffle", "--compose", "tokens", "--epochs", 2],
    ["--grad-accum", 2, "--pp", 2, "--warmup", "reorder", "--max-shapes", 6, "--epochs", 2],
]
PIPELINE_BASE = ["--max-tokens", 4096, "--dp", 3, "--oversize", "drop", "--cost", "flops",
                 "--model-preset", "qwen2.5-0.5b"]  # fmt: skip
#: refusals every rank agrees on, and a part of the line they print
AGREED = [
    (["--max-tokens", 512], "samples do not fit --max-tokens 512 even alone"),
    (["--max-tokens", 4096, "--dp", 5000], "cannot fill one step"),
    (
        ["--max-tokens", 4096, "--order", "shuffle", "--layout", "padded"],
        "--compose cost in the padded layout is not planned across",
    ),
    (["--max-tokens", 4096, "--batching", "blocks"], "--batching blocks is not planned across"),
]
CARRIED = ["--max-tokens", 4096, "--dp", 4, "--oversize", "split", "--split-len", 700,
           "--carry", "source", "-q"]  # fmt: skip
CARRY_FAULTS = ["null", "repeated", "missing"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Case, Ran]]:
    """Every run under mpiexec that shares a job, by name: its case ``(ranks, args)`` and what
    it gave (the sorts under mpiexec that make some inputs: ``sort-NAME``)."""
    top = tmp_path_factory.mktemp("plan-mpi")
    plans: dict[str, Case] = {}
    sorts: dict[str, Case] = {}
    for seed in range(24):
        tmp = top / f"seed{seed}"
        sorted_out, args, sort = _case(tmp, seed)
        if sort is not None:
            sorts[f"seed{seed}"] = sort
        ranks = RANKS[seed % len(RANKS)]
        plans[f"seed{seed}"] = (ranks, ["plan", sorted_out, tmp / f"ranks{ranks}", *args])
    piped = _pipeline_input(top / "pp")
    for i, args in enumerate(PIPELINE):
        for ranks in (2, 4):
            full = [*PIPELINE_BASE, *args, "-q"]
            plans[f"pp{i}-{ranks}"] = (ranks, ["plan", piped, top / "pp" / f"{i}-r{ranks}", *full])
    few = _few_samples(top / "few")
    plans["few"] = (4, ["plan", few, top / "few" / "four", "--max-tokens", 1024, "--dp", 2,
                        "--epochs", 2, "-q"])  # fmt: skip
    agreed = _agreed_input(top / "agreed")
    for i, (args, _) in enumerate(AGREED):
        plans[f"agreed{i}"] = (3, ["plan", agreed, top / "agreed" / f"out{i}", *args])
    for fault in CARRY_FAULTS:
        sorted_out, args = _carry_fault(top / "carry", fault)
        plans[f"carry-{fault}"] = (3, ["plan", sorted_out, top / "carry" / f"out-{fault}", *args])
    sorts["rowgroups"] = _row_groups_input(top / "rowgroups")
    for ranks in (2, 4):
        plans[f"rowgroups{ranks}"] = (ranks, ["plan", top / "rowgroups" / "sorted",
                                              top / "rowgroups" / f"r{ranks}", *CARRIED,
                                              "--carry-from", top / "rowgroups" / "meta"])  # fmt: skip
    raw = top / "raw"
    write_shards(raw / "meta", np.arange(100), np.full(100, 10), [100])
    plans["raw"] = (2, ["plan", raw / "meta", raw / "out", "--max-tokens", 64])
    usage = top / "usage"
    plans["usage"] = (3, ["plan", usage / "in", usage / "out", "--max-tokens", 0])
    # the sorts first: the jobs of their rank counts run first, and them first in those jobs
    cases = {**{f"sort-{name}": case for name, case in sorts.items()}, **plans}
    got = mpiexec_many(list(cases.values()), top / "jobs")
    return {name: (case, ran) for (name, case), ran in zip(cases.items(), got, strict=True)}


def _ok(got: Ran) -> Ran:
    """A run that must succeed (as ``testkit.mpiexec`` checks it)."""
    assert got.returncode == 0, f"rc={got.returncode}\nstdout:\n{got.stdout}\nstderr:\n{got.stderr}"
    return got


@pytest.mark.parametrize("seed", range(24))
def test_plans_are_the_one_process_plan(runs: dict[str, tuple[Case, Ran]], seed: int) -> None:
    if f"sort-seed{seed}" in runs:  # the input sorted by three ranks
        _ok(runs[f"sort-seed{seed}"][1])
    (ranks, (_, sorted_out, out, *args)), got = runs[f"seed{seed}"]
    tmp = Path(str(out)).parent
    one = cli("plan", sorted_out, tmp / "one", *args, expect=None)
    assert got.returncode == one.exit_code, (args, got.stderr, one.output)
    if one.exit_code:  # the same refusal: one line, nothing written
        assert got.stderr.strip() == one.output.strip()
        assert not Path(str(out)).exists()
    else:
        assert _files(Path(str(out))) == _files(tmp / "one"), (ranks, args)
        assert got.stdout.replace(str(out), "OUT") == one.stdout.replace(str(tmp / "one"), "OUT")
    leftovers = [p.name for p in tmp.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def _pipeline_input(tmp: Path) -> Path:
    rng = np.random.default_rng(11)
    n = 4000
    write_shards(tmp / "meta", rng.permutation(3 * n)[:n], _lengths(rng, n, "tail", 4096),
                 [n // 2, n - n // 2])  # fmt: skip
    cli("sort", tmp / "meta", tmp / "sorted", "-q")
    return tmp / "sorted"


@pytest.mark.parametrize("args", PIPELINE)
def test_pipeline_parallel_plans_are_the_one_process_plan(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path, args: list[object]
) -> None:
    """``--pp`` (packed): each (step, rank) padded to its largest micro-batch on the rank that
    holds the step; the warm-up reorder moves whole (step, rank) groups."""
    i = PIPELINE.index(args)
    (_, (_, sorted_out, _, *full)), _ = runs[f"pp{i}-2"]
    cli("plan", sorted_out, tmp_path / "one", *full)
    for ranks in (2, 4):
        (_, (_, _, out, *_)), got = runs[f"pp{i}-{ranks}"]
        _ok(got)
        assert _files(Path(str(out))) == _files(tmp_path / "one"), (ranks, args)


def _few_samples(tmp: Path) -> Path:
    rng = np.random.default_rng(3)
    write_shards(tmp / "meta", np.arange(30), rng.integers(1, 500, 30), [30])
    cli("sort", tmp / "meta", tmp / "sorted", "-q")
    return tmp / "sorted"


def test_more_ranks_than_steps(runs: dict[str, tuple[Case, Ran]]) -> None:
    """Ranks that end up holding no step write their share of nothing: still the same plan."""
    (_, (_, sorted_out, four, *args)), got = runs["few"]
    _ok(got)
    one = Path(str(four)).parent / "one"
    cli("plan", sorted_out, one, *args)
    assert _files(Path(str(four))) == _files(one)


def _agreed_input(tmp: Path) -> Path:
    rng = np.random.default_rng(5)
    write_shards(tmp / "meta", np.arange(2000), rng.integers(1, 3000, 2000), [2000])
    cli("sort", tmp / "meta", tmp / "sorted", "-q")
    return tmp / "sorted"


@pytest.mark.parametrize("args, line", AGREED)
def test_failures_are_agreed(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path, args: list[object], line: str
) -> None:
    """Every rank stops; one line (the one process's, where it fails too), one exit code;
    nothing is left. The ranks end by ``Abort`` in a job of their own: a batch of this module
    gives the same."""
    (_, (_, sorted_out, batched, *_)), in_batch = runs[f"agreed{AGREED.index((args, line))}"]
    one = cli("plan", sorted_out, tmp_path / "one", *args, expect=None)
    got = mpiexec(3, "plan", sorted_out, tmp_path / "out", *args, check=False)
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr.count("\n") == 1 and line in got.stderr
    if one.exit_code:
        assert got.stderr.strip() == one.output.strip()
    leftovers = {"one"} if one.exit_code == 0 else set()
    assert {p.name for p in tmp_path.iterdir()} == leftovers
    assert (in_batch.returncode, in_batch.stdout, in_batch.stderr) == (2, "", got.stderr)
    assert not Path(str(batched)).exists()
    assert not [p for p in Path(str(batched)).parent.iterdir() if p.name.startswith(".")]


def test_raw_metadata_is_refused_under_mpi(runs: dict[str, tuple[Case, Ran]]) -> None:
    (_, (_, _, out, *_)), got = runs["raw"]
    assert got.returncode == 2 and got.stderr.count("\n") == 1
    assert "run varpack sort first" in got.stderr and not Path(str(out)).exists()


def _carry_fault(top: Path, fault: str) -> tuple[Path, list[object]]:
    """Metadata (sorted once for the three faults) and a carry source with ``fault``."""
    rng = np.random.default_rng(9)
    n = 3000
    ids = rng.permutation(10 * n)[:n]
    lens = rng.integers(1, 900, n)
    if not (top / "sorted").exists():
        write_shards(top / "meta", ids, lens, [n])
        cli("sort", top / "meta", top / "sorted", "-q")
    keep = np.ones(n, bool)
    values = pa.array(rng.choice(["a", "b", "c"], n))
    carry_ids = ids.copy()
    if fault == "null":
        values = pa.array(
            [None if i in (700, 2900) else v for i, v in enumerate(values.to_pylist())]
        )
    elif fault == "repeated":
        carry_ids[[100, 2500]] = carry_ids[[1200, 40]]
    else:
        keep[[5, 1700, 2999]] = False
    table = pa.table({"sample_id": carry_ids[keep], "source": values.filter(pa.array(keep))})
    carry = top / f"carry-{fault}"
    carry.mkdir()
    for k, part in enumerate(np.array_split(np.arange(int(keep.sum())), 3)):
        pq.write_table(table.take(pa.array(part)), carry / f"{k}.parquet", row_group_size=250)
    args = ["--max-tokens", 4096, "--dp", 2, "--carry", "source", "--carry-from", carry, "-q"]
    return top / "sorted", args


@pytest.mark.parametrize("fault", CARRY_FAULTS)
def test_carry_errors_are_the_one_process_line(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path, fault: str
) -> None:
    """A carry source with a null, a repeated id or without some planned ids: every rank reads
    a share of it, and the line is the one process's (the first offender of the whole source,
    the count of all)."""
    (_, (_, sorted_out, _, *args)), got = runs[f"carry-{fault}"]
    one = cli("plan", sorted_out, tmp_path / "one", *args, expect=None)
    assert one.exit_code == 2 and got.returncode == 2, (one.output, got.stderr)
    assert got.stderr.strip() == one.output.strip()


def _row_groups_input(tmp: Path) -> Case:
    """Metadata in row groups of 300 rows (one file empty), and the sort of two ranks."""
    rng = np.random.default_rng(4)
    n = 5000
    ids = rng.permutation(3 * n)[:n]
    write_shards(tmp / "meta", ids, rng.integers(1, 2000, n), [n // 2, 0, n - n // 2],
                 source=rng.choice(np.array(["web", "code", "books"]), n))  # fmt: skip
    for f in sorted((tmp / "meta").iterdir()):
        pq.write_table(pq.read_table(f), f, row_group_size=300)
    return (2, ["sort", tmp / "meta", tmp / "sorted", "-q"])


def test_carried_values_from_a_source_in_many_row_groups(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path
) -> None:
    """The carried values reach the same samples whichever rank read them."""
    _ok(runs["sort-rowgroups"][1])
    (_, (_, sorted_out, _, *args)), _ = runs["rowgroups2"]
    meta = Path(str(sorted_out)).parent / "meta"
    assert pq.ParquetFile(meta / "shard-000.parquet").num_row_groups > 1
    cli("plan", sorted_out, tmp_path / "one", *args)
    for ranks in (2, 4):
        (_, (_, _, out, *_)), got = runs[f"rowgroups{ranks}"]
        _ok(got)
        assert _files(Path(str(out))) == _files(tmp_path / "one")


def test_a_usage_error_under_mpi_is_one_line(runs: dict[str, tuple[Case, Ran]]) -> None:
    """Every rank parses the same flags; rank 0 alone prints the usage error."""
    got = runs["usage"][1]
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr.count("\n") == 1 and "--max-tokens" in got.stderr
