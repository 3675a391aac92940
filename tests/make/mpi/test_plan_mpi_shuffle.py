"""``varpack plan --order shuffle`` under mpiexec: the one-process plan, byte for byte.

The property test of ``test_plan_mpi.py`` draws shuffled option sets among the others; here the
cases it rarely draws: steps composed by cost (with the warm-up reorder, kept-alone samples,
full-budget pieces, and the fallback to tokens where the last window cannot be composed), and
epochs large enough for the two-level permutation (its block and bucket sizes made small, in
both the one process and the ranks).

The runs under mpiexec are made up front, one MPI job per rank count (``tests/mpi_batch.py``; the
cases that patch the planner say so in the environment they set); each test then checks its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mpi_batch import Case, Ran, mpiexec_many
from testkit import cli, write_shards

from varpack.plan.kernels import permute

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


def _rollouts(tmp: Path, n: int, seed: int) -> Path:
    """RL rollouts in small, sorted: a prompt and a response cut at half the budget of 4 K (a
    quarter reach it), so that at grad-accum 1 most windows are dealt window-wide and their
    slots cut in a seeded order."""
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(np.exp(rng.normal(np.log(90), 0.7, n))), 4, 1024)
    response = np.clip(np.rint(np.exp(rng.normal(np.log(1050), 1.0, n))), 1, 2048)
    lens = (prompt + response).astype(np.int64)
    write_shards(tmp / "meta", rng.permutation(3 * n)[:n], lens, [n // 2, n - n // 2])
    cli("sort", tmp / "meta", tmp / "sorted", "-q")
    return tmp / "sorted"


ROLLOUTS = ["--max-tokens", 4096, "--order", "shuffle", "--seed", 1, "--dp", 4, "--epochs", 2,
            "--cost", "flops", "--model-preset", "qwen2.5-0.5b"]  # fmt: skip
COMPOSED = [
    ["--dp", 4, "--grad-accum", 2, "--epochs", 2, "--shuffle-window", 3],
    ["--dp", 2, "--grad-accum", 1, "--epochs", 1, "--warmup", "reorder", "--cost", "flops",
     "--model-preset", "qwen2.5-0.5b"],
    ["--dp", 3, "--grad-accum", 4, "--epochs", 3, "--oversize", "alone", "--shuffle-window", 1],
    ["--dp", 8, "--grad-accum", 2, "--oversize", "split", "--balance-fill", 0.9],
    ["--dp", 2, "--grad-accum", 2, "--epochs", 2, "--warmup", "reorder", "--max-shapes", 6,
     "--lr-scaling", "sqrt", "--base-batch-size", 32.0],
]  # fmt: skip


#: one rank count per composed case (each count met), as the CP cases below
COMPOSED_RANKS = (3, 4, 2, 4, 3)
#: the balance engine: both syncs, grad-accum 1 to 4, samples alone, shapes, a warm-up reorder
ENGINE = [
    ["--dp", 4, "--grad-accum", 2, "--epochs", 2, "--shuffle-window", 3, "--sync", "step"],
    ["--dp", 2, "--grad-accum", 1, "--warmup", "reorder", "--cost", "flops", "--model-preset",
     "qwen2.5-0.5b"],
    ["--dp", 3, "--grad-accum", 4, "--epochs", 2, "--oversize", "alone", "--shuffle-window", 1,
     "--sync", "micro", "--cost", "flops", "--model-preset", "qwen2.5-0.5b"],
    ["--dp", 2, "--grad-accum", 2, "--max-shapes", 6, "--shuffle-window", 1],
]  # fmt: skip
ENGINE_RANKS = (3, 2, 4, 3)
CP_RANKS = (2, 3, 3, 2)
FALLBACK = ["--max-tokens", 4096, "--order", "shuffle", "--dp", 8, "--grad-accum", 2,
            "--oversize", "drop"]  # fmt: skip
TWO_LEVEL = ["--max-tokens", "4096", "--order", "shuffle", "--dp", "2", "--grad-accum", "2",
             "--epochs", "2", "--oversize", "drop", "-q"]  # fmt: skip
REDONE = ["--max-tokens", "4096", "--order", "shuffle", "--dp", "2", "--grad-accum", "2",
          "--cost", "flops", "--model-preset", "qwen2.5-0.5b", "--oversize", "drop", "-q"]  # fmt: skip

#: the two-level permutation's sizes made small (the test sets them in-process)
SMALL = {"WHOLE": 1000, "BUCKET": 256, "BLOCK": 700}

#: what the ranks of this module's jobs run first. In a case that sets COUNT_REDONE, each rank
#: says how many windows it composed again with samples carried in; in a case that sets
#: SMALL_PERMUTATION, the permutation's sizes are SMALL (the batch calls ``varpack.cli.main`` as
#: this leaves it). The other cases run the planner as it is.
_PATCHES = f"""
import os
import varpack.cli
from mpi4py import MPI
from varpack.make.mpi import compose
from varpack.plan.kernels import permute
composed_again = compose._all
def counted(w, carry, held, found):
    out = composed_again(w, carry, held, found)
    if os.environ.get("COUNT_REDONE"):
        print(f"rank {{MPI.COMM_WORLD.Get_rank()}}: {{len(carry)}} carried in, "
              f"{{len(out)}} of {{len(w.starts) - 1}} windows composed again", flush=True)
    return out
compose._all = counted
main = varpack.cli.main
def small_permutation(*args, **kwargs):
    if not os.environ.get("SMALL_PERMUTATION"):
        return main(*args, **kwargs)
    kept = {{name: getattr(permute, name) for name in {SMALL!r}}}
    for name, value in {SMALL!r}.items():
        setattr(permute, name, value)
    try:
        return main(*args, **kwargs)
    finally:
        for name, value in kept.items():
            setattr(permute, name, value)
varpack.cli.main = small_permutation
"""


CONTEXT_PARALLEL = [
    ["--cp", 2, "--bucket-size", 4096],
    ["--cp", 2, "--bucket-size", 4096, "--order", "shuffle", "--epochs", 2, "--seed", 3],
    ["--cp", 4, "--bucket-size", 2048, "--cp-batching", "greedy", "--epochs", 2,
     "--cp-placement", "round-robin"],
    ["--cp", 2, "--bucket-size", 4096, "--cp-placement", "distributed", "--warmup", "reorder",
     "--order", "shuffle", "--compose", "tokens"],
]  # fmt: skip


def _composed_args(case: int) -> list[object]:
    args = ["--max-tokens", 4096, "--order", "shuffle", "--seed", case, *COMPOSED[case]]
    return args + ([] if "--oversize" in args else ["--oversize", "drop"])


def _engine_args(case: int) -> list[object]:
    args = ["--max-tokens", 4096, "--order", "shuffle", "--seed", case, "--compose", "engine",
            *ENGINE[case]]  # fmt: skip
    return args + ([] if "--oversize" in args else ["--oversize", "drop"])


def _cp_args(case: int) -> list[object]:
    return ["--max-tokens", 4096, "--dp", 2, "--grad-accum", 2, "--oversize", "drop",
            *CONTEXT_PARALLEL[case]]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Case, Ran]]:
    """Every plan under mpiexec of this module, by name: its case ``(ranks, args, env)`` and
    what it gave."""
    top = tmp_path_factory.mktemp("shuffle-mpi")
    cases: dict[str, Case] = {}
    for case in range(len(COMPOSED)):
        sorted_out = _sorted(top / f"composed{case}", 6000, case)
        out = top / f"composed{case}" / "out"
        cases[f"composed{case}"] = (COMPOSED_RANKS[case], ["plan", sorted_out, out,
                                                           *_composed_args(case)])  # fmt: skip
    for case in range(len(ENGINE)):
        sorted_out = _sorted(top / f"engine{case}", 6000, 40 + case)
        out = top / f"engine{case}" / "out"
        cases[f"engine{case}"] = (ENGINE_RANKS[case], ["plan", sorted_out, out,
                                                       *_engine_args(case)], {"COUNT_REDONE": "1"})  # fmt: skip
    rl = _rollouts(top / "rollouts", 5000, 5)
    cases["rollouts"] = (3, ["plan", rl, top / "rollouts" / "out", *ROLLOUTS])
    few = _sorted(top / "fallback", 90, 3)
    for ranks in (2, 4):
        cases[f"fallback{ranks}"] = (
            ranks,
            ["plan", few, top / "fallback" / f"r{ranks}", *FALLBACK],
        )
    for case in range(len(CONTEXT_PARALLEL)):
        sorted_out = _sorted(top / f"cp{case}", 5000, 30 + case)
        out = top / f"cp{case}" / "out"
        cases[f"cp{case}"] = (CP_RANKS[case], ["plan", sorted_out, out, *_cp_args(case)])
    again = _sorted(top / "redone", 6000, 21)
    for ranks in (3, 4):
        out = top / "redone" / f"r{ranks}"
        cases[f"redone{ranks}"] = (ranks, ["plan", again, out, *REDONE], {"COUNT_REDONE": "1"})
    shared = _sorted(top / "buckets", 5000, 11)
    small = {"SMALL_PERMUTATION": "1"}
    for compose in ("cost", "tokens"):
        for ranks in (2, 3):
            out = top / "buckets" / f"{compose}-r{ranks}"
            args = ["plan", shared, out, *TWO_LEVEL, "--compose", compose]
            cases[f"{compose}{ranks}"] = (ranks, args, small)
    ran = mpiexec_many(list(cases.values()), top / "jobs", prelude=_PATCHES)
    got = {name: (case, r) for (name, case), r in zip(cases.items(), ran, strict=True)}
    return got


def _ok(got: Ran) -> Ran:
    """A run that must succeed (as ``testkit.mpiexec`` checks it)."""
    assert got.returncode == 0, f"rc={got.returncode}\nstdout:\n{got.stdout}\nstderr:\n{got.stderr}"
    return got


def _out(case: Case) -> Path:
    return Path(str(case[1][2]))


@pytest.mark.parametrize("case", range(len(COMPOSED)))
def test_steps_composed_by_cost_are_the_one_process_plan(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path, case: int
) -> None:
    (ranks, (_, sorted_out, out, *args)), got = runs[f"composed{case}"]
    one = cli("plan", sorted_out, tmp_path / "one", *args)
    _ok(got)
    assert _files(Path(str(out))) == _files(tmp_path / "one"), (ranks, args)
    assert got.stdout.replace(str(out), "OUT") == one.stdout.replace(str(tmp_path / "one"), "OUT")


def test_the_engine_composes_the_one_process_plan(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path
) -> None:
    """``--compose engine``: every rank composes its windows by the engine's rule, carries
    resolved between ranks; the plan is the one process's, byte for byte."""
    carried = 0
    for case in range(len(ENGINE)):
        (ranks, (_, sorted_out, out, *args), _), got = runs[f"engine{case}"]
        one = cli("plan", sorted_out, tmp_path / f"one{case}", *args)
        _ok(got)
        assert _files(Path(str(out))) == _files(tmp_path / f"one{case}"), (ranks, args)
        shown = got.stdout.replace(str(out), "OUT").splitlines()
        assert [x for x in shown if "carried in" not in x] == one.stdout.replace(
            str(tmp_path / f"one{case}"), "OUT").splitlines()  # fmt: skip
        carried += sum("carried in" in x and not x.split(": ")[1].startswith("0 ") for x in shown)
    assert carried > 0  # samples carried across ranks were composed in


def test_windows_dealt_window_wide_are_the_one_process_plan(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path
) -> None:
    # grad-accum 1: which windows were dealt window-wide travels with the rows to the slot cut
    (_, (_, sorted_out, out, *args)), got = runs["rollouts"]
    cli("plan", sorted_out, tmp_path / "one", *args)
    _ok(got)
    assert _files(Path(str(out))) == _files(tmp_path / "one")


def test_an_epoch_too_small_to_compose_falls_back_alike(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path
) -> None:
    """Too few samples for the last window's steps: one process composes by tokens instead, and
    so do the ranks (the rank holding the last window says so for all)."""
    cli("plan", runs["fallback2"][0][1][1], tmp_path / "one", *FALLBACK)
    assert "moved_steps_mean" in (tmp_path / "one" / "plan.json").read_text()
    for ranks in (2, 4):
        case, got = runs[f"fallback{ranks}"]
        _ok(got)
        assert _files(_out(case)) == _files(tmp_path / "one")


@pytest.mark.parametrize("compose", ["cost", "tokens"])
def test_the_two_level_permutation_is_drawn_alike(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path, compose: str, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Above WHOLE samples the permutation is drawn in buckets, labels block by block: each rank
    draws its own samples' labels and the bucket owners shuffle; same plan as one process."""
    (_, (_, sorted_out, _, *args), _), _ = runs[f"{compose}2"]
    cli("plan", sorted_out, tmp_path / "plain", *args)  # the sizes as they are
    for name, value in SMALL.items():
        monkeypatch.setattr(permute, name, value)
    cli("plan", sorted_out, tmp_path / "r1", *args)
    outs = {1: _files(tmp_path / "r1")}
    for ranks in (2, 3):
        case, got = runs[f"{compose}{ranks}"]
        assert got.returncode == 0, got.stderr
        outs[ranks] = _files(_out(case))
    assert outs[2] == outs[1] and outs[3] == outs[1]
    # the draw is not numpy's one-pass permutation there: the patch took effect
    assert _files(tmp_path / "plain") != outs[1]


def test_a_carry_between_ranks_is_composed_in(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path
) -> None:
    """Where a rank's last window hands samples on, the next rank composes its first windows
    again with them (every rank composed its own at once, as if none came in): the plan is
    still the one process's."""
    cli("plan", runs["redone3"][0][1][1], tmp_path / "one", *REDONE)
    redone = 0
    for ranks in (3, 4):
        case, got = runs[f"redone{ranks}"]
        assert got.returncode == 0, got.stderr
        redone += got.stdout.count("carried in")
        assert _files(_out(case)) == _files(tmp_path / "one")
    assert redone > 0  # the case this test is for did occur


@pytest.mark.parametrize("case", range(len(CONTEXT_PARALLEL)))
def test_context_parallel_plans_are_the_one_process_plan(
    runs: dict[str, tuple[Case, Ran]], tmp_path: Path, case: int
) -> None:
    """``--cp``: GDS steps, the CP placement and the ``cp`` figures of plan.json, per rank."""
    (ranks, (_, sorted_out, out, *args)), got = runs[f"cp{case}"]
    cli("plan", sorted_out, tmp_path / "one", *args)
    assert '"cp"' in (tmp_path / "one" / "plan.json").read_text()
    _ok(got)
    assert _files(Path(str(out))) == _files(tmp_path / "one"), (ranks, args)
