"""``inspect --plot`` on long plans: per-step panels drawn as percentile bands over buckets of
steps (:func:`varpack.inspect.plot.step_bands`), and the length histogram of documents."""

from __future__ import annotations

import json

import numpy as np
import pytest
from testkit import cli, write_metadata

from varpack.inspect import plot as plot_module
from varpack.inspect.plot import BAND_STEPS, QUANTILES, document_lengths, step_bands


def test_bands_are_the_quantiles_of_each_bucket_of_steps():
    rng = np.random.default_rng(0)
    num_steps, buckets = 1003, 7
    step = np.sort(rng.integers(0, num_steps, 20_000))
    step = step[(step < 280) | (step >= 450)]  # steps 280..449 hold nothing: bucket 2 is empty
    values = rng.normal(size=len(step))
    edges, bands = step_bands(step, values, num_steps, buckets)
    assert edges[0] == 0 and edges[-1] == num_steps and len(edges) == buckets + 1
    assert np.all(np.diff(edges) >= num_steps // buckets)
    assert bands.shape == (len(QUANTILES), buckets)
    for i in range(buckets):
        inside = values[(step >= edges[i]) & (step < edges[i + 1])]
        if len(inside) == 0:
            assert np.isnan(bands[:, i]).all()
            continue
        assert np.allclose(bands[:, i], np.quantile(inside, QUANTILES))
        assert bands[2, i] == pytest.approx(np.median(inside))
    assert np.isnan(bands[:, 2]).all()  # the empty bucket (steps 286..428 of 1003)


def test_bands_of_one_value_a_step_and_fewer_steps_than_buckets():
    edges, bands = step_bands(np.arange(4), np.array([4.0, 1.0, 3.0, 2.0]), 4, buckets=200)
    assert edges.tolist() == [0, 1, 2, 3, 4]  # a bucket a step
    assert np.array_equal(bands[0], [4, 1, 3, 2]) and np.array_equal(bands[4], [4, 1, 3, 2])
    edges, bands = step_bands(np.arange(6), np.array([1.0, 5, 2, 8, 3, 3]), 6, buckets=2)
    assert bands[2].tolist() == [2.0, 3.0] and bands[0].tolist() == [1, 3]
    assert bands[4].tolist() == [5, 8]


def test_document_lengths_join_the_pieces_and_count_each_document_once():
    ids = np.array([5, 9, 5, 5, 9, 2])  # 5: three pieces (0, 100, 200), in two epochs for 9
    lens = np.array([100, 40, 100, 30, 40, 7])
    ends = np.array([100, 40, 200, 230, 40, 7])
    assert document_lengths(ids, lens, ends).tolist() == [7, 230, 40]
    assert document_lengths(ids, lens, None).tolist() == [7, 100, 40]


def test_a_ten_thousand_step_plan_plots_bands(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    n = 20_000
    lens = np.r_[rng.integers(60, 250, n - 50), rng.integers(300, 900, 50)]
    meta = write_metadata(tmp_path / "m.parquet", np.arange(n), lens)
    plan = tmp_path / "plan"
    cli("plan", meta, plan, "--max-tokens", 256, "--oversize", "split", "--order", "shuffle",
        "--lr-scaling", "sqrt", "--base-batch-size", 4, "--max-shapes", 8)  # fmt: skip
    steps = json.loads((plan / "plan.json").read_text())["num_steps"]
    assert steps > 10_000 > BAND_STEPS
    drawn: list[tuple[np.ndarray, np.ndarray]] = []
    bands = plot_module._bands

    def record(ax, edges, b, color, label=None):
        drawn.append((edges, b))
        bands(ax, edges, b, color, label)

    monkeypatch.setattr(plot_module, "_bands", record)
    documents: list[np.ndarray] = []
    lengths = plot_module.document_lengths
    monkeypatch.setattr(
        plot_module, "document_lengths", lambda *a: documents.append(lengths(*a)) or documents[-1]
    )
    png = tmp_path / "plan.png"
    cli("inspect", plan, "--plot", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert len(drawn) == 3  # tokens per micro-batch, LR factor, rank load: bands, not lines
    for edges, b in drawn:
        assert edges[-1] == steps and b.shape[1] == 200
        assert np.all(b[0] <= b[2]) and np.all(b[2] <= b[4])
    assert sorted(documents[0].tolist()) == sorted(lens.tolist())  # documents, not pieces
