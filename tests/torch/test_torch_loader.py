"""PlanLoader: order, bookkeeping, rank checks, exact O(1) resume with any num_workers."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from plan_helpers import make_plan, random_lengths, write_tokens  # noqa: E402

from varpack.errors import ConfigError, InputError  # noqa: E402
from varpack.torch import PackedBatch, PaddedBatch, ParquetTokenDataset, PlanLoader, rank_shapes  # noqa: E402
from varpack.torch.state import seal  # noqa: E402


@pytest.fixture
def setup(tmp_path, rng):
    lens = random_lengths(rng, 90, 2, 30)
    truth = write_tokens(
        tmp_path / "tok.parquet", list(lens), list(lens.values()), row_group_size=8
    )
    plan = make_plan(tmp_path / "plan", lens, dp=2, grad_accum=3, budget=64, pad_multiple=8)
    return plan, ParquetTokenDataset(tmp_path / "tok.parquet"), truth, lens


def _same(a, b) -> bool:
    return (
        type(a) is type(b)
        and (a.step, a.micro, a.epoch, a.is_last_micro)
        == (b.step, b.micro, b.epoch, b.is_last_micro)
        and torch.equal(a.input_ids, b.input_ids)
        and torch.equal(a.labels, b.labels)
        and torch.equal(a.sample_ids, b.sample_ids)
    )


def test_replays_the_manifest_in_order(setup) -> None:
    plan, ds, truth, lens = setup
    loader = PlanLoader(plan, ds, rank=1)
    table = loader.plan.rank_table(1).to_pylist()
    batches = list(loader)
    assert len(batches) == len(table) == len(loader)
    for row, b in zip(table, batches, strict=True):
        assert isinstance(b, PackedBatch)
        assert (b.step, b.micro) == (row["step"], row["micro"])
        assert b.sample_ids.tolist() == row["sample_ids"]
        assert b.input_ids.shape == (1, row["pad_to"])
        n = sum(row["seq_lens"])
        expect = np.concatenate([truth[i] for i in row["sample_ids"]])
        assert b.input_ids[0, :n].tolist() == expect.tolist()
        assert (b.step_tokens, b.step_samples, b.lr_factor) == (
            row["step_tokens"],
            row["step_samples"],
            row["lr_factor"],
        )
        assert b.is_last_micro == (row["micro"] == 2)
    assert loader.lr_factors().shape == (loader.num_steps,)


def test_both_ranks_cover_every_sample_once(setup) -> None:
    plan, ds, _, lens = setup
    seen = [int(i) for r in range(2) for b in PlanLoader(plan, ds, rank=r) for i in b.sample_ids]
    assert sorted(seen) == sorted(lens)


def test_world_size_and_checksum_errors(setup, monkeypatch) -> None:
    plan, ds, _, _ = setup
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(InputError, match="made for dp=2 .* world size 3"):
        PlanLoader(plan, ds)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert PlanLoader(plan, ds).rank == 1
    with pytest.raises(InputError, match="outside the plan's dp=2"):
        PlanLoader(plan, ds, rank=2)
    with pytest.raises(ConfigError, match="made for the 'packed' layout"):
        PlanLoader(plan, ds, rank=0, collate="padded")
    # A changed manifest or a future version is refused (each rank checks its own file).
    (plan / "rank-00001.parquet").write_bytes((plan / "rank-00000.parquet").read_bytes())
    with pytest.raises(InputError, match="rank-00001.parquet: sha256 does not match"):
        PlanLoader(plan, ds, rank=1)
    assert len(PlanLoader(plan, ds, rank=1, verify=False)) > 0
    doc = json.loads((plan / "plan.json").read_text())
    doc["version"] = 99
    (plan / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="plan version 99"):
        PlanLoader(plan, ds, rank=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_gives_identical_batches(setup, workers) -> None:
    plan, ds, _, _ = setup
    full = list(PlanLoader(plan, ds, rank=0))
    first = PlanLoader(plan, ds, rank=0, num_workers=workers)
    it = iter(first)
    k = 5  # stop in the middle of a step
    for _ in range(k):
        next(it)
    state = first.state_dict()
    assert (state["step"], state["micro"]) == (full[k].step, full[k].micro)
    del it
    resumed = PlanLoader(plan, ds, rank=0, num_workers=workers)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # survives a JSON checkpoint
    rest = list(resumed)
    assert len(rest) == len(full) - k
    assert all(_same(a, b) for a, b in zip(rest, full[k:], strict=True))
    # The finished pass leads into the next epoch, from the first row again.
    end = resumed.state_dict()
    assert end["step"] == resumed.num_steps and end["epoch"] == 0
    again = next(iter(resumed))
    assert again.epoch == 1 and again.step == 0 and torch.equal(again.input_ids, full[0].input_ids)


def test_state_is_rank_independent(setup) -> None:
    plan, ds, _, _ = setup
    a, b = PlanLoader(plan, ds, rank=0), PlanLoader(plan, ds, rank=1)
    for _ in zip(range(4), a, strict=False):
        pass
    b.load_state_dict(a.state_dict())
    first = next(iter(b))
    assert (first.step, first.micro) == (1, 1)


def test_state_from_another_plan_is_refused(setup, tmp_path, rng) -> None:
    plan, ds, _, lens = setup
    other = make_plan(tmp_path / "other", lens, dp=2, grad_accum=3, budget=48)
    state = PlanLoader(other, ds, rank=0).state_dict()
    with pytest.raises(InputError, match="belongs to another plan"):
        PlanLoader(plan, ds, rank=0).load_state_dict(state)


def test_padded_plan_with_pad_rows(tmp_path) -> None:
    lens = {1: 3, 2: 5, 3: 2, 4: 4}
    data = {i: np.arange(n) + 10 * i for i, n in lens.items()}
    plan = make_plan(
        tmp_path / "p", lens, layout="padded", micros=[[1, 2, 3], [4]], pad_rows=[0, 2]
    )
    batches = list(PlanLoader(plan, data, rank=0, pin_memory=False))
    assert all(isinstance(b, PaddedBatch) for b in batches)
    assert [b.shape for b in batches] == [(3, 5), (3, 4)]
    assert batches[1].attention_mask.sum(1).tolist() == [4, 0, 0]


@pytest.mark.parametrize(
    "flags",
    [
        ("--layout", "padded", "--max-shapes", "2", "--warmup", "reorder"),
        ("--batching", "blocks", "--block-len", "48", "--blocks-per-batch", "2"),
        ("--layout", "packed", "--pack-to", "96"),
    ],
    ids=["padded-shapes", "blocks", "pack-to"],
)
def test_real_planner_plans_replay(tmp_path, rng, flags) -> None:
    """Plans from `varpack plan` (pad_rows, block_index, warm-up): shapes as recorded, ids once."""
    from testkit import cli, write_metadata

    lens = random_lengths(rng, 60, 2, 40)
    data = {i: np.arange(n) + 1 for i, n in lens.items()}
    write_metadata(tmp_path / "meta" / "m.parquet", list(lens), list(lens.values()))
    plan = tmp_path / "plan"
    cli(
        "plan",
        tmp_path / "meta",
        plan,
        "--dp",
        "2",
        "--grad-accum",
        "2",
        "--max-tokens",
        "96",
        *flags,
        "-q",
    )
    seen = []
    for rank in range(2):
        loader = PlanLoader(plan, data, rank=rank)
        shapes = [b.shape for b in loader]
        assert set(shapes) == set(rank_shapes(loader, rank))
        seen += [int(i) for b in loader for i in b.sample_ids]
        if loader.layout == "blocks":
            b = next(iter(loader))
            assert b.resets.sum() == len(b.sample_ids) and b.shape[1] == 48
    assert sorted(seen) == sorted(lens)


@pytest.mark.parametrize(
    "key, value",
    [("step", 10**9), ("epoch", -3), ("step", 3.7), ("micro", 3), ("step", "2"), ("micro", True)],
)
def test_damaged_state_is_refused(setup, key, value) -> None:
    plan, ds, _, _ = setup
    loader = PlanLoader(plan, ds, rank=0)
    state = {**loader.state_dict(), key: value}
    with pytest.raises(InputError, match=f"loader state {key} .*must be an integer in"):
        loader.load_state_dict(state)
    done = seal({**loader.state_dict(), "step": loader.num_steps, "micro": 0})  # the pass finished
    loader.load_state_dict(done)
    assert next(iter(loader)).epoch == 1  # the next pass starts
