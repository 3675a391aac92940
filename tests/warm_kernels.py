"""Compile the planner's numba kernels once, before the test workers start.

    python tests/warm_kernels.py WORKDIR [composed|others|all]

numba caches a compiled kernel in ``__pycache__`` (``cache=True``), so a clean clone compiles
each kernel on first use: about a minute of CPU for the suite's kernels. Left to the tests, two
workers, or the ranks of an ``mpiexec``, that reach a kernel at the same time each compile it.
Under ``pytest -n N`` in a clean clone, ``tests/conftest.py`` runs this twice side by side while
the workers collect: ``composed`` plans the families whose steps are composed by cost (the
longest kernels to compile) and context parallelism, ``others`` the rest (about 50 CPU-s each). Every family is planned through the CLI, so
the kernels meet the argument types the tests give them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner
from golden.record import PLANS

from varpack.cli import main

#: beyond the golden option families: context parallelism (its batcher and placements) and
#: steps composed by a FLOPs cost
EXTRA: dict[str, list[str]] = {
    "shuffle-cost-flops": ["--max-tokens", "4096", "--order", "shuffle", "--cost", "flops",
                           "--model-preset", "qwen2.5-0.5b", "--dp", "2", "--oversize", "drop"],
    "cp-gds": ["--max-tokens", "4096", "--cp", "2", "--bucket-size", "4096", "--dp", "2",
               "--order", "shuffle", "--seed", "3", "--oversize", "drop"],
    "cp-greedy": ["--max-tokens", "4096", "--cp", "4", "--bucket-size", "2048", "--oversize",
                  "drop", "--cp-batching", "greedy", "--cp-placement", "round-robin"],
    # the padded layout at grad-accum 1: blocks pooled by four, rows levelled between bands
    "padded-k1-flops": ["--max-tokens", "8192", "--layout", "padded", "--order", "shuffle",
                        "--cost", "flops", "--model-preset", "qwen2.5-0.5b", "--dp", "2"],
}  # fmt: skip


def composed(opts: list[str]) -> bool:
    """Steps composed by cost (shuffled budget batching in the packed layout, neither blocks nor
    fixed batches), and context parallelism: the two halves of the compile, about even (the
    padded layout's bands take kernels of their own, in the other half)."""
    shuffled = "shuffle" in opts and not {"blocks", "fixed", "padded"} & set(opts)
    return shuffled or "--cp" in opts


def families(part: str) -> list[tuple[str, list[str]]]:
    every = {**PLANS, **EXTRA}.items()
    return [(k, v) for k, v in every if part == "all" or (part == "composed") == composed(v)]


def _run(*args: object) -> str | None:
    """None, or what failed: a family that no longer plans is said, the others still warmed."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exit_code == 0:
        return None
    failed = f"warm_kernels: varpack {' '.join(map(str, args))}: {result.output.strip()}"
    print(failed, file=sys.stderr)
    return failed


def warm_readers(work: Path) -> list[str]:
    """The token copy's kernels: check values written by ``lengths --arrow-copy``, verified by
    every read (each trainer rank would compile them); what failed."""
    from varpack.metadata import token_check

    rng = np.random.default_rng(1)
    ids = [rng.integers(0, 500, int(n)).astype(np.int32) for n in rng.integers(5, 300, 200)]
    (work / "tok").mkdir(parents=True)
    pq.write_table(pa.table({"input_ids": ids}), work / "tok" / "t.parquet")
    failed = _run("lengths", work / "tok", work / "tmeta", "--arrow-copy", work / "t.arrow", "-q")
    token_check.warm()
    return [failed] if failed else []


def warm_online() -> None:
    """``plan_batch``: composed by cost as ``composed`` plans are (its kernels and theirs),
    under each of its options, as ``varpack compile`` warms them."""
    from varpack.online import compile_kernels

    compile_kernels()


def warm(work: Path, part: str) -> list[str]:
    """Plan every family of ``part`` under ``work``; what failed (``tests/test_warm_kernels.py``
    keeps it empty)."""
    rng = np.random.default_rng(0)
    n = 3000
    ids = rng.permutation(3 * n)[:n].astype(np.int64)
    lens = np.minimum(np.exp(rng.normal(6.0, 1.2, n)).astype(np.int64) + 1, 2048)  # the demo's
    (work / "meta").mkdir(parents=True)
    pq.write_table(pa.table({"sample_id": ids, "seq_len": lens}), work / "meta" / "m.parquet")
    failed = [_run("sort", work / "meta", work / "sorted", "-q")]
    failed += [
        _run("plan", work / "sorted", work / name, *opts, "-q") for name, opts in families(part)
    ]
    if part in ("others", "all"):
        failed += warm_readers(work)
    if part in ("composed", "all"):
        warm_online()
    return [f for f in failed if f]


if __name__ == "__main__":
    start = time.process_time()
    warm(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "all")
    print(f"warm_kernels: {time.process_time() - start:.1f}s of CPU")
