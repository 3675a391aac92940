"""A run stopped on one world size resumes on another: ``varpack replan`` + ``train.py --resume``
in gloo ranks (started as torchrun starts them). Every sample is trained exactly once per epoch
over the two parts. (A replan with the same dp ends with the uninterrupted run's weights:
test_torch_distributed.py.)"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")

from plan_helpers import random_lengths, ranks, write_tokens  # noqa: E402
from testkit import cli, write_metadata  # noqa: E402

from varpack.torch.checkpoint import load_checkpoint  # noqa: E402
from varpack.torch.records import Records  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "jobs" / "train.py"


def train(nproc: int, *args: object, check: bool = True):  # type: ignore[no-untyped-def]
    """train.py on ``nproc`` ranks; one rank runs its ``main`` in this process (a world of one
    has nothing to launch; its imports are paid once)."""
    if nproc > 1 or not check:
        return ranks(nproc, ROOT / "jobs" / "train.py", *args, check=check)
    spec = importlib.util.spec_from_file_location("varpack_jobs_train_replan", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        code = module.main([str(a) for a in args])
    assert code == 0, said.getvalue()
    return subprocess.CompletedProcess(["train.py", *map(str, args)], code, said.getvalue(), "")


def _seen(out: Path, world: int, first: int = 1) -> list[int]:
    """The ids the ``world`` ranks of the run segment from step ``first`` on trained."""
    records = [r for r in Records(out).read() if r["first_step"] == first]
    assert sorted(r["rank"] for r in records) == list(range(world))
    return [i for r in records for i in r["sample_ids"]]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    tmp = tmp_path_factory.mktemp("replan")
    lens = random_lengths(np.random.default_rng(11), 72, 2, 40)
    write_tokens(tmp / "tok.parquet", list(lens), list(lens.values()), row_group_size=16)
    write_metadata(tmp / "meta" / "m.parquet", list(lens), list(lens.values()))
    return tmp, lens


def _plan(tmp: Path, name: str, *extra: object) -> Path:
    plan = tmp / name
    cli("plan", tmp / "meta", plan, "--dp", 2, "--max-tokens", 96, "--pad-multiple", 16,
        "--seed", 3, "--lr-scaling", "linear", "--base-batch-size", 8, "-q", *extra)  # fmt: skip
    return plan


# Each case stops once and resumes on one other world size (each run costs seconds of
# start-up per rank): a smaller world, a larger one, a larger one with a new batch (grad-accum),
# after a stop in the curriculum, in a shuffled epoch 0 and in epoch 1. A resume on the wrong
# world size is refused once, with three ranks.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("order", "epochs", "stop", "dp", "extra"),
    [
        ("curriculum", 1, 3, 1, ()),
        ("shuffle", 2, 3, 3, ()),
        ("shuffle", 2, "epoch1", 3, ("--grad-accum", 3)),
    ],
    ids=["curriculum-to-dp1", "shuffle-to-dp3", "epoch1-to-dp3-new-batch"],
)
def test_a_run_resumes_on_other_world_sizes_and_trains_every_sample_once_per_epoch(
    data: tuple[Path, dict[int, int]],
    order: str,
    epochs: int,
    stop: int | str,
    dp: int,
    extra: tuple[object, ...],
) -> None:
    tmp, lens = data
    stop = f"{order}-{stop}" if stop == 3 else stop
    plan = _plan(tmp, f"plan-{stop}", "--grad-accum", 3, "--order", order, "--epochs", epochs)
    meta = json.loads((plan / "plan.json").read_text())
    # in epoch 0 (early enough that 9 micro-batches can be made of what is left) or in epoch 1
    at = meta["epochs"][1]["first_step"] + 2 if stop == "epoch1" else meta["num_steps"] // 3
    common = ["--data", tmp / "tok.parquet", "--record", "--warmup-steps", "2"]
    run = tmp / f"run-{stop}"
    train(2, "--plan", plan, *common, "--out", run, "--max-steps", at)
    first = _seen(run, 2)
    if dp == 1:  # dp 3 on the same checkpoint: refused with the exact replan command
        wrong = train(3, "--plan", plan, *common, "--out", run, "--resume", check=False)
        assert wrong.returncode != 0
        assert f"varpack replan {plan} {plan}-dp3 --from-step {at} --dp 3" in wrong.stderr
    child = tmp / f"child-{stop}-{dp}-{len(extra)}"
    cli("replan", plan, child, "--from-step", at, "--dp", dp, *extra, "-q")
    steps = at + json.loads((child / "plan.json").read_text())["num_steps"]
    cli("validate", child, "--metadata", tmp / "meta")  # with its parent: once per epoch
    again = tmp / f"run-{stop}-dp{dp}-{len(extra)}"
    shutil.copytree(run, again)
    out = train(dp, "--plan", child, *common, "--out", again, "--resume")
    assert f"resumed after step {at} ({at} of the plan's {steps} steps done" in out.stdout
    assert _seen(again, 2) == first  # the first segment's records stay, one per rank
    counts = Counter(first + _seen(again, dp, at + 1))
    assert set(counts) == set(lens) and set(counts.values()) == {epochs}  # once per epoch
    done = load_checkpoint(again / "checkpoint.pt")
    assert done["lr"]["last_step"] == steps


def test_the_loader_of_a_replan_takes_its_parents_state_at_that_step_only(
    data: tuple[Path, dict[int, int]],
) -> None:
    from varpack.errors import InputError
    from varpack.torch import PlanLoader

    tmp, lens = data
    plan = _plan(tmp, "plan-loader", "--grad-accum", 2)
    tokens = {i: np.arange(n) for i, n in lens.items()}
    loader = PlanLoader(plan, tokens, rank=0, world_size=2)
    it = iter(loader)
    for _ in range(4):  # steps 0 and 1
        next(it)
    state = loader.state_dict()
    assert (state["step"], state["micro"]) == (2, 0)
    cli("replan", plan, tmp / "loader-child", "--from-step", 2, "--dp", 1, "-q")
    child = PlanLoader(tmp / "loader-child", tokens, rank=0, world_size=1)
    child.load_state_dict(state)
    assert child.num_steps == loader.num_steps and child.first_step == 2
    batch = next(iter(child))
    assert (batch.step, batch.micro) == (2, 0)
    assert child.state_dict()["step"] == 2 and child.state_dict()["micro"] == 1
    assert np.all(np.isnan(child.lr_factors()[:2]) == False)  # noqa: E712
    cli("replan", plan, tmp / "loader-late", "--from-step", 3, "--dp", 1, "-q")
    late = PlanLoader(tmp / "loader-late", tokens, rank=0, world_size=1)
    with pytest.raises(InputError, match="--from-step 2 --dp 1"):
        late.load_state_dict(state)
    other = _plan(tmp, "plan-other", "--grad-accum", 2, "--seed", 9)
    with pytest.raises(InputError, match="belongs to another plan"):
        PlanLoader(other, tokens, rank=0, world_size=2).load_state_dict(child.state_dict())
