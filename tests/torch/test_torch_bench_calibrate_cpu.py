"""The CPU time-model bench: the reference model's spec, the fit on plans' micro-batches.

Timings on a shared CPU are never asserted; the fits are checked on times that follow a known
four-term law, through the bench's own rows, CSV and tables.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_calibrate_cpu as bench  # noqa: E402
import gpu_steps  # noqa: E402

from varpack.plan.models.flops import linear_per_token  # noqa: E402
from varpack.plan.timefit import TERMS, micro_features  # noqa: E402
from varpack.torch.model import PRESETS, TinyGPT  # noqa: E402


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_the_spec_counts_the_models_matmuls(preset: str) -> None:
    """FlopCounterMode's mm / addmm / bmm of TinyGPT's forward are the spec's linear FLOPs."""
    model = TinyGPT(PRESETS[preset])
    s = 96
    ids = torch.zeros(1, s, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model(ids, torch.arange(s)[None])
    ops = counter.get_flop_counts()["Global"]
    mm = sum(v for k, v in ops.items() if str(k).split(".")[1] in ("mm", "addmm", "bmm"))
    assert mm == linear_per_token(gpu_steps.spec_of(preset)) * s


def _law(monkeypatch: pytest.MonkeyPatch, coef: list[float]) -> None:
    """Step times that follow the four-term law exactly, in the spec's FLOPs."""

    def fake(self, batches, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = []
        for b in batches:
            lens = b.seq_lens.numpy()
            f = micro_features(lens, np.array([0, len(lens)]), np.array([b.input_ids.shape[1]]),
                               gpu_steps.spec_of(self.preset))  # fmt: skip
            out.append(float(f.matrix()[0] @ np.array(coef)))
        return np.array(out)

    monkeypatch.setattr(gpu_steps.Stepper, "time", fake)


def test_the_fit_recovers_the_law_and_the_old_model_misses_it(tmp_path, monkeypatch) -> None:
    law = [2e-11, 6e-11, 4e-3, 2e-2]  # attention dearer per FLOP, a cost per sequence
    _law(monkeypatch, law)
    out = tmp_path / "cpu"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    got = report["fit"]
    assert [got[t] for t in TERMS] == pytest.approx(law, rel=1e-6)
    assert got["time_error_held_out"]["max_pct"] < 1e-6 and got["held_out"] > 0
    assert set(got["time_error_held_out_by_kind"]) == set(bench.KINDS)
    old = got["flops_line"]["time_error_held_out"]["mean_pct"]
    assert old > 1.0 and got["calibrate"]["time_error_held_out"]["mean_pct"] > 1.0
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    assert len(rows) == report["rows"] and set(rows[0]) >= {"kind", "linear_flops", "step_time"}
    assert [r["kind"] for r in rows] == sorted((r["kind"] for r in rows), key=bench.KINDS.index)
    table = out.with_suffix(".md").read_text()
    for name in (bench.NEW, bench.OLD, bench.CALIBRATE, *bench.KINDS):
        assert name in table
    assert f"| {bench.NEW} | 0.0 % / 0.0 % |" in table


def test_measure_keeps_each_rows_time_in_place(monkeypatch) -> None:
    """Rows are timed in a shuffled order; each time comes back to its own row."""
    monkeypatch.setattr(gpu_steps.Stepper, "time", lambda self, batches, **k: np.array(
        [float(b.input_ids.shape[1]) for b in batches]))  # fmt: skip
    micro = [{"kind": "single pieces", "lens": np.array([t]), "pad_to": t} for t in (64, 128, 192)]
    assert bench.measure("tiny", micro, 1, 0.0).tolist() == [64.0, 128.0, 192.0]


def test_quick_run_with_real_steps(tmp_path) -> None:
    out = tmp_path / "cpu"
    assert bench.main(["--quick", "--preset", "tiny", "--reps", "1", "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert all(r["step_time"] > 0 for r in report["measured"])
    assert set(report["kinds"]) == set(bench.KINDS) and all(report["kinds"].values())
    assert "| time model | all |" in out.with_suffix(".md").read_text()
