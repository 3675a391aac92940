"""``varpack plan --order shuffle`` under mpiexec: the one-process plan, byte for byte.

The property test of ``test_plan_mpi.py`` draws shuffled option sets among the others; here the
cases it rarely draws: steps composed by cost (with the warm-up reorder, kept-alone samples,
full-budget pieces, and the fallback to tokens where the last window cannot be composed), and
epochs large enough for the two-level permutation (its block and bucket sizes made small, in
both the one process and the ranks).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from testkit import BIN, cli, mpiexec, write_shards

pytestmark = pytest.mark.mpi


def _files(plan: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(plan.iterdir())}


def _sorted(tmp: Path, n: int, seed: int, budget: int = 4096) -> Path:
    """Long-SFT lengths (a log-normal body, 0.5 % near or over the budget), sorted."""
    rng = np.random.default_rng(seed)
    body = np.exp(rng.normal(5.5, 1.1, n)).astype(np.int64) + 1
    near = rng.random(n) < 0.005
    lens = np.where(near, rng.integers(budget // 2, budget + budget // 8, n), body)
    write_shards(tmp / "meta", rng.permutation(3 * n)[:n], lens, [n // 2, n - n // 2])
    cli("sort", tmp / "meta", tmp / "sorted", "-q")
    return tmp / "sorted"


COMPOSED = [
    ["--dp", 4, "--grad-accum", 2, "--epochs", 2, "--shuffle-window", 3],
    ["--dp", 2, "--grad-accum", 1, "--epochs", 1, "--warmup", "reorder", "--cost", "flops",
     "--model-preset", "qwen2.5-0.5b"],
    ["--dp", 3, "--grad-accum", 4, "--epochs", 3, "--oversize", "alone", "--shuffle-window", 1],
    ["--dp", 8, "--grad-accum", 2, "--oversize", "split", "--balance-fill", 0.9],
    ["--dp", 2, "--grad-accum", 2, "--epochs", 2, "--warmup", "reorder", "--max-shapes", 6,
     "--lr-scaling", "sqrt", "--base-batch-size", 32.0],
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(COMPOSED)))
def test_steps_composed_by_cost_are_the_one_process_plan(tmp_path: Path, case: int) -> None:
    sorted_out = _sorted(tmp_path, 6000, case)
    args = ["--max-tokens", 4096, "--order", "shuffle", "--seed", case, *COMPOSED[case]]
    args += [] if "--oversize" in args else ["--oversize", "drop"]
    one = cli("plan", sorted_out, tmp_path / "one", *args)
    ranks = (3, 4, 2, 4, 3)[case]  # one count per case (a second of start-up per rank), each met
    out = tmp_path / f"ranks{ranks}"
    got = mpiexec(ranks, "plan", sorted_out, out, *args)
    assert _files(out) == _files(tmp_path / "one"), (ranks, args)
    assert got.stdout.replace(str(out), "OUT") == one.stdout.replace(str(tmp_path / "one"), "OUT")


def test_an_epoch_too_small_to_compose_falls_back_alike(tmp_path: Path) -> None:
    """Too few samples for the last window's steps: one process composes by tokens instead, and
    so do the ranks (the rank holding the last window says so for all)."""
    sorted_out = _sorted(tmp_path, 90, 3)
    args = ["--max-tokens", 4096, "--order", "shuffle", "--dp", 8, "--grad-accum", 2,
            "--oversize", "drop"]  # fmt: skip
    cli("plan", sorted_out, tmp_path / "one", *args)
    assert "moved_steps_mean" in (tmp_path / "one" / "plan.json").read_text()
    for ranks in (2, 4):
        mpiexec(ranks, "plan", sorted_out, tmp_path / f"r{ranks}", *args)
        assert _files(tmp_path / f"r{ranks}") == _files(tmp_path / "one")


_SMALL_BUCKETS = """
import sys
from varpack.plan.kernels import permute
permute.WHOLE, permute.BUCKET, permute.BLOCK = 1000, 256, 700
from varpack.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("compose", ["cost", "tokens"])
def test_the_two_level_permutation_is_drawn_alike(tmp_path: Path, compose: str) -> None:
    """Above WHOLE samples the permutation is drawn in buckets, labels block by block: each rank
    draws its own samples' labels and the bucket owners shuffle; same plan as one process."""
    sorted_out = _sorted(tmp_path, 5000, 11)
    script = tmp_path / "small_buckets.py"
    script.write_text(_SMALL_BUCKETS)
    args = ["plan", str(sorted_out), "", "--max-tokens", "4096", "--order", "shuffle",
            "--dp", "2", "--grad-accum", "2", "--epochs", "2", "--compose", compose,
            "--oversize", "drop", "-q"]  # fmt: skip
    outs = {}
    for ranks in (1, 2, 3):
        out = tmp_path / f"r{ranks}"
        args[2] = str(out)
        cmd = [sys.executable, str(script), *args]
        if ranks > 1:
            cmd = [str(BIN / "mpiexec"), "-n", str(ranks), sys.executable, "-m", "mpi4py", *cmd[1:]]
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert got.returncode == 0, got.stderr
        outs[ranks] = _files(out)
    assert outs[2] == outs[1] and outs[3] == outs[1]
    # the draw is not numpy's one-pass permutation there: the patch took effect
    plain = tmp_path / "plain"
    cli(*args[:2], plain, *args[3:])
    assert _files(plain) != outs[1]


_REDONE = """
import sys
from mpi4py import MPI
from varpack.manifest.mpi import compose
composed_again = compose._all
def counted(w, carry, held, found):
    out = composed_again(w, carry, held, found)
    print(f"rank {MPI.COMM_WORLD.Get_rank()}: {len(carry)} carried in, "
          f"{len(out)} of {len(w.starts) - 1} windows composed again", flush=True)
    return out
compose._all = counted
from varpack.cli import main
main(sys.argv[1:])
"""


def test_a_carry_between_ranks_is_composed_in(tmp_path: Path) -> None:
    """Where a rank's last window hands samples on, the next rank composes its first windows
    again with them (every rank composed its own at once, as if none came in): the plan is
    still the one process's."""
    sorted_out = _sorted(tmp_path, 6000, 21)
    script = tmp_path / "redone.py"
    script.write_text(_REDONE)
    args = ["--max-tokens", "4096", "--order", "shuffle", "--dp", "2", "--grad-accum", "2",
            "--cost", "flops", "--model-preset", "qwen2.5-0.5b", "--oversize", "drop", "-q"]  # fmt: skip
    cli("plan", sorted_out, tmp_path / "one", *args)
    redone = 0
    for ranks in (3, 4):
        out = tmp_path / f"r{ranks}"
        cmd = [str(BIN / "mpiexec"), "-n", str(ranks), sys.executable, "-m", "mpi4py",
               str(script), "plan", str(sorted_out), str(out), *args]  # fmt: skip
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert got.returncode == 0, got.stderr
        redone += got.stdout.count("carried in")
        assert _files(out) == _files(tmp_path / "one")
    assert redone > 0  # the case this test is for did occur


CONTEXT_PARALLEL = [
    ["--cp", 2, "--bucket-size", 4096],
    ["--cp", 2, "--bucket-size", 4096, "--order", "shuffle", "--epochs", 2, "--seed", 3],
    ["--cp", 4, "--bucket-size", 2048, "--cp-batching", "greedy", "--epochs", 2,
     "--cp-placement", "round-robin"],
    ["--cp", 2, "--bucket-size", 4096, "--cp-placement", "distributed", "--warmup", "reorder",
     "--order", "shuffle", "--compose", "tokens"],
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(CONTEXT_PARALLEL)))
def test_context_parallel_plans_are_the_one_process_plan(tmp_path: Path, case: int) -> None:
    """``--cp``: GDS steps, the CP placement and the ``cp`` figures of plan.json, per rank."""
    sorted_out = _sorted(tmp_path, 5000, 30 + case)
    args = ["--max-tokens", 4096, "--dp", 2, "--grad-accum", 2, "--oversize", "drop",
            *CONTEXT_PARALLEL[case]]  # fmt: skip
    cli("plan", sorted_out, tmp_path / "one", *args)
    assert '"cp"' in (tmp_path / "one" / "plan.json").read_text()
    ranks = (2, 3, 3, 2)[case]  # one count per case, as above
    mpiexec(ranks, "plan", sorted_out, tmp_path / f"r{ranks}", *args)
    assert _files(tmp_path / f"r{ranks}") == _files(tmp_path / "one"), (ranks, args)
