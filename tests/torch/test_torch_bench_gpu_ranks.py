"""The ranks benchmark on the CPU: its plans, its peers, its scorer and a ``--quick`` run.

Timings on a shared CPU mean nothing and are never asserted; what is checked is what holds
whatever the timings: the scorer's two synchronisation models, the peers' schedules (every
sample once, every rank as many micro-batches per step), and that every row runs end to end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402

BENCHES = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHES))

import bench_gpu_ranks as bench  # noqa: E402
import gpu_ranks_plans as plans  # noqa: E402

from varpack.plan import PlanConfig  # noqa: E402
from varpack.plan.models import ModelDims  # noqa: E402

DIMS = ModelDims(64, 64, 2)


def _schedule(rng: np.random.Generator, steps: int, dp: int, k: int) -> plans.Schedule:
    n = steps * dp * k
    sizes = rng.integers(1, 4, n)
    step, rank, slot = np.unravel_index(np.arange(n), (steps, dp, k))
    return plans.Schedule(rng.integers(1, 50, int(sizes.sum())),
                          np.concatenate(([0], np.cumsum(sizes))), np.full(n, 64), step, rank,
                          slot)  # fmt: skip


def test_the_two_sync_models_by_hand() -> None:
    """Rank 0 runs 3 then 1, rank 1 runs 1 then 3: equal step sums (DDP waits for nobody), but
    each slot waits for its 3 (FSDP: 6)."""
    s = plans.Schedule(np.ones(4, int), np.arange(5), np.ones(4, int), np.zeros(4, int),
                       np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]))  # fmt: skip
    assert plans.sync_times(np.array([3.0, 1, 1, 3]), s, 2) == {"step": 4, "micro": 6, "ideal": 4}
    aligned = np.array([3.0, 1, 3, 1])  # heavy micro-batches in the same slot
    assert plans.sync_times(aligned, s, 2) == {"step": 4, "micro": 4, "ideal": 4}


def test_micro_sync_never_beats_step_sync(rng) -> None:
    """For any times: ideal <= step <= micro (a sum of maxima is at least the max of sums)."""
    s = _schedule(rng, 3, 4, 3)
    for _ in range(20):
        t = rng.random(len(s.pad_to))
        got = plans.sync_times(t, s, 4)
        assert got["ideal"] <= got["step"] + 1e-12 <= got["micro"] + 2e-12
        assert got["ideal"] == pytest.approx(t.sum() / 4)


def test_take_spreads_steps_over_the_plan(rng) -> None:
    s = _schedule(rng, 10, 2, 2)
    got = s.take(3)
    assert got.steps == 3 and len(got.pad_to) == 3 * 2 * 2
    keep = [0, 4, 9]  # np.linspace(0, 9, 3).round() -> 0, 4.5 -> 4, 9
    want = np.concatenate([s.micro(i) for i in np.flatnonzero(np.isin(s.step, keep))])
    assert np.array_equal(got.lens, want)  # whole micro-batches, in run order
    assert np.array_equal(got.step, np.repeat([0, 1, 2], 4))


@pytest.mark.parametrize("equal_size", [True, False])
def test_karmarkar_karp_partitions(rng, equal_size) -> None:
    x = rng.integers(1, 1000, 48)
    parts = plans.karmarkar_karp(x, 4, equal_size)
    assert sorted(i for p in parts for i in p) == list(range(48))
    sums = [int(x[p].sum()) for p in parts]
    assert sums == sorted(sums, reverse=True)  # heaviest first
    assert max(sums) - min(sums) < x.max()  # balanced better than one item apart
    if equal_size:
        assert {len(p) for p in parts} == {12}


def test_peer_kk_is_verls_schedule(rng) -> None:
    lens = rng.integers(1, 300, 3000)
    s = plans.peer_kk(lens, 512, 4, 2)
    per_batch = len(s.lens) // s.steps
    tokens = np.add.reduceat(s.lens, s.offsets[:-1])
    for step in range(s.steps):
        mine = s.step == step
        counts = np.bincount(s.rank[mine], minlength=4)
        assert len(set(counts)) == 1  # every rank runs as many micro-batches
        samples = [np.diff(s.offsets)[mine & (s.rank == r)].sum() for r in range(4)]
        assert len(set(samples)) == 1  # equal sample counts per rank (equal_size)
        assert sum(samples) == per_batch
    assert sorted(s.lens) == sorted(lens[np.random.default_rng(0).permutation(3000)][: len(s.lens)])
    assert tokens.max() <= 1.5 * 512  # balanced parts of ceil(tokens / budget)


def test_peer_sorted_greedy_holds_the_budget(rng) -> None:
    lens = rng.integers(1, 300, 2000)
    s = plans.peer_sorted_greedy(lens, 512, 4, 2)
    tokens = np.add.reduceat(s.lens, s.offsets[:-1])
    assert tokens.max() <= 512 and np.all(np.diff(s.lens) >= 0)  # sorted, packed in order
    assert np.all(np.bincount(s.step * 4 + s.rank) == 2)  # grad-accum 2 per rank and step
    assert np.all(s.pad_to % plans.PAD == 0) and np.all(s.pad_to >= tokens)


def test_sync_rows_appear_once_the_config_has_sync(monkeypatch) -> None:
    """Until ``PlanConfig`` has ``sync`` the varpack rows are one per grad-accum; with it, one
    per ``--sync`` model, each planned with that option."""
    seen = []
    monkeypatch.setattr(plans, "varpack_plan", lambda *a, **kw: seen.append(kw))
    names = list(plans.varpack_plans(np.ones(10, int), 64, 2, DIMS))
    if "sync" not in PlanConfig.__dataclass_fields__:
        assert names == ["varpack shuffled, ga 1", "varpack shuffled, ga 4",
                         "varpack curriculum, ga 4"]  # fmt: skip
        fields = dict(PlanConfig.__dataclass_fields__, sync=None)
        monkeypatch.setattr(PlanConfig, "__dataclass_fields__", fields)
        seen.clear()
        names = list(plans.varpack_plans(np.ones(10, int), 64, 2, DIMS))
    assert names[:4] == [f"varpack shuffled, ga {k}, --sync {m}"
                         for k in (1, 4) for m in ("step", "micro")]  # fmt: skip
    assert [kw.get("sync") for kw in seen[:4]] == ["step", "micro", "step", "micro"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA skip")
def test_without_cuda_it_skips_cleanly(tmp_path, capsys) -> None:
    assert bench.main(["--quick", "--out", str(tmp_path / "r")]) == 0
    assert "no CUDA device here; skipped" in capsys.readouterr().out
    assert not (tmp_path / "r.json").exists()


def test_quick_run_on_cpu(tmp_path) -> None:
    out = tmp_path / "ranks"
    assert bench.main(["--quick", "--device", "cpu", "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    rows = report["rows"]
    assert {r["shape"] for r in rows} == set(plans.SHAPES)
    names = {r["plan"] for r in rows}
    assert {"varpack curriculum, ga 4", "peer: KK by tokens (verl), ga 4",
            "peer: sorted greedy packing, ga 4"} <= names  # fmt: skip
    for r in rows:
        assert r["status"] == "ok" and r["micro_batches"] > 0 and r["tokens"] > 0
        for src in ("measured", "flops", "time_model"):  # time >= ideal, micro >= step
            v = r["vs_ideal"][src]
            assert 1 - 1e-9 <= v["step"] <= v["micro"] + 1e-9
        tm, e = r["time_model_s"], r["time_model_error_pct"]
        assert e["step"] == pytest.approx((tm["step"] / r["measured_s"]["step"] - 1) * 100)
    model = report["time_model"]
    assert model["time_per_flop"] > 0 and "fitted here" in model["source"]
    table = out.with_suffix(".md").read_text()
    assert "| step sync: measured |" in table and "CPU smoke run" in table


def test_a_calibration_file_gives_the_time_model(tmp_path, monkeypatch) -> None:
    """``--calib`` takes (a, b) from bench_calibrate_gpu's JSON; predictions use them."""
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps({"time_per_flop": 2e-12, "time_fixed": 0.25}))
    monkeypatch.setattr(bench, "SHAPES", {"RL rollouts": plans.rollouts})
    monkeypatch.setattr(plans, "all_plans", lambda lens, b, dp, dims: {
        "peer: sorted greedy packing, ga 4": plans.peer_sorted_greedy(lens, b, dp, 4)})  # fmt: skip
    monkeypatch.setattr(bench, "all_plans", plans.all_plans)
    out = tmp_path / "ranks"
    assert bench.main(["--quick", "--device", "cpu", "--calib", str(calib), "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["time_model"]["source"] == str(calib)
    (row,) = report["rows"]
    # every micro-batch's prediction is a * flops + b: the ideal is their sum over dp
    assert row["time_model_s"]["ideal"] == pytest.approx(
        (2e-12 * row["flops"]["ideal"] * report["dp"] + 0.25 * row["micro_batches"]) / report["dp"]
    )


def test_a_refused_time_fit_falls_back_to_the_origin(tmp_path, monkeypatch) -> None:
    """Noisy calibration times that varpack's fit refuses: seconds per FLOP on average instead,
    and the source says so."""

    def refuse(*a, **k):  # type: ignore[no-untyped-def]
        raise bench.InputError("calibrate: step time does not grow with the work")

    monkeypatch.setattr(bench, "calibrate", refuse)
    monkeypatch.setattr(bench, "SHAPES", {"RL rollouts": plans.rollouts})
    monkeypatch.setattr(bench, "all_plans", lambda lens, b, dp, dims: {
        "peer: sorted greedy packing, ga 4": plans.peer_sorted_greedy(lens, b, dp, 4)})  # fmt: skip
    out = tmp_path / "ranks"
    assert bench.main(["--quick", "--device", "cpu", "--out", str(out)]) == 0
    model = json.loads(out.with_suffix(".json").read_text())["time_model"]
    assert model["time_fixed"] == 0 and model["time_per_flop"] > 0
    assert "does not grow with the work; through the origin" in model["source"]
