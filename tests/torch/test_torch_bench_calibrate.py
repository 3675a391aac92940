"""The calibration bench on the CPU: plans' micro-batches measured, CSV written, models fitted.

Timings on a shared CPU mean nothing (and are never asserted); the fits are checked on times
that follow a known law, through the script's own CSV and ``varpack calibrate`` path: the base
model recovers ``a * flops + b``, and a cost per sample is found (and called needed) only when
the times have one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_calibrate_gpu as bench  # noqa: E402
import gpu_steps  # noqa: E402


def test_micro_batches_of_three_kinds() -> None:
    micro = bench.micro_batches([64, 128, 256], 2, gpu_steps.dims_of("tiny"))
    kinds = [m["kind"] for m in micro]
    assert set(kinds) == set(bench.KINDS)
    chat = [m for m in micro if m["kind"] == "chat rows"]
    single = [m for m in micro if m["kind"] == "single pieces"]
    assert max(len(m["lens"]) for m in chat) > 3  # many short samples in a row
    assert [int(m["lens"][0]) for m in single] == [64, 128, 256]
    for m in micro:  # every row holds its samples, padded to the pad multiple
        assert m["lens"].sum() <= m["pad_to"] and m["pad_to"] % 64 == 0


def test_measure_runs_real_steps() -> None:
    dims = gpu_steps.dims_of("tiny")
    micro = bench.micro_batches([64, 128], 1, dims)[:2] + bench.micro_batches([64], 1, dims)[-1:]
    stepper = gpu_steps.Stepper("tiny", torch.device("cpu"))
    with gpu_steps.steady(torch.device("cpu")):
        rows = bench.measure(stepper, micro, 1, dims)
    assert len(rows) == 3 and all(r["step_time"] > 0 for r in rows)
    assert all(r["peak_memory"] is None for r in rows)  # no allocator peak on the CPU
    assert all(r["flops"] == r["linear"] + r["attention"] for r in rows)
    assert [r["kind"] for r in rows] == sorted((r["kind"] for r in rows), key=bench.KINDS.index)


def test_quick_run_on_cpu(tmp_path) -> None:
    """End to end with real steps: CSV, varpack's calibration file, the candidates' table."""
    out = tmp_path / "calib"
    assert bench.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    got = json.loads(out.with_suffix(".json").read_text())
    assert got["varpack_calibration"] == 1 and got["time_per_flop"] > 0
    report = json.loads(out.with_name("calib-fits.json").read_text())
    assert report["device"] == "cpu" and set(report["kinds"]) == set(bench.KINDS)
    assert all(n > 0 for n in report["kinds"].values())
    assert set(bench.CANDIDATES) <= set(report["fits"])
    lines = out.with_suffix(".csv").read_text().splitlines()
    assert lines[0] == "tokens,samples,flops,step_time" and len(lines) == report["rows"] + 1
    table = out.with_suffix(".md").read_text()
    assert "| a*flops + b + c*samples |" in table and "CPU smoke run" in table
    assert f"| {bench.TIMEFIT} |" in table and f"| {bench.TIMEFIT_LINE} |" in table
    four = report["fits"][bench.TIMEFIT]
    assert set(four["coef"]) == {"time_per_linear_flop", "time_per_attention_flop",
                                 "time_per_sequence", "time_per_micro_batch"}  # fmt: skip
    assert set(four["by_kind"]) == set(bench.KINDS)


def _law(monkeypatch, per_sample: float) -> None:
    """Step times that follow a * flops + b (+ per_sample * samples) exactly."""
    dims = gpu_steps.dims_of("tiny")

    def fake(self, batches, new_step=None, reps=1, deadline=None):  # type: ignore[no-untyped-def]
        out = []
        for b in batches:
            lens = b.seq_lens.numpy()
            flops = gpu_steps.micro_flops(lens, int(b.input_ids.shape[1]), dims)
            out.append(3e-9 * flops + 0.01 + per_sample * len(lens))
        return np.array(out)

    monkeypatch.setattr(gpu_steps.Stepper, "time", fake)


def test_the_fit_recovers_the_law(tmp_path, monkeypatch, capsys) -> None:
    _law(monkeypatch, 0.0)
    out = tmp_path / "calib"
    assert bench.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    got = json.loads(out.with_suffix(".json").read_text())
    assert got["time_per_flop"] == pytest.approx(3e-9) and got["time_fixed"] == pytest.approx(0.01)
    assert got["held_out"] > 0 and got["time_error_held_out"]["max_pct"] < 1e-6
    assert "memory_per_token" not in got
    assert out.with_suffix(".csv").read_text().startswith("tokens,samples,flops,step_time")
    fits = json.loads(out.with_name("calib-fits.json").read_text())["fits"]
    assert not fits["a*flops + b + c*samples"]["needed"]
    assert fits["single pieces only -> plan rows"]["max_pct"] < 1e-6
    assert "| a*flops + b | 0.0 % / 0.0 % |" in out.with_suffix(".md").read_text()


def test_a_cost_per_sample_is_found(tmp_path, monkeypatch) -> None:
    _law(monkeypatch, 0.002)
    out = tmp_path / "calib"
    assert bench.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    fits = json.loads(out.with_name("calib-fits.json").read_text())["fits"]
    base, term = fits["a*flops + b"], fits["a*flops + b + c*samples"]
    assert base["held_out"]["mean_pct"] > 2  # a*flops + b misses the chat rows
    assert term["needed"] and term["held_out"]["max_pct"] < 1e-6
    assert term["coef"]["samples"] == pytest.approx(0.002)
    assert fits["single pieces only -> plan rows"]["max_pct"] > base["held_out"]["max_pct"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_without_cuda_it_says_so(tmp_path, capsys) -> None:
    assert bench.main(["--out", str(tmp_path / "x")]) == 0
    said = capsys.readouterr().out
    assert "no CUDA device" in said and "not yet measured" in said
    assert not (tmp_path / "x.csv").exists()


def test_no_repetition_starts_past_the_deadline(monkeypatch) -> None:
    passes = []
    monkeypatch.setattr(gpu_steps.Stepper, "_pass", lambda self, b, f: passes.append(1) or [1.0])
    stepper = gpu_steps.Stepper("tiny", torch.device("cpu"))
    batch = stepper.batch(np.array([3, 4]), 64)
    stepper.time([batch], reps=5, deadline=0.0)  # long past: the first pass only
    assert len(passes) == 1
    stepper.time([batch], reps=5)
    assert len(passes) == 6


def test_a_fit_varpack_refuses_is_reported(tmp_path, monkeypatch, capsys) -> None:
    """Times that shrink with the work (noise on a shared CPU): varpack calibrate refuses them in
    one line; the bench says so, writes no calibration file and still compares the candidates."""
    monkeypatch.setattr(gpu_steps.Stepper, "time", lambda self, batches, *a, **k: np.array(
        [1.0 / b.input_ids.shape[1] for b in batches]))  # fmt: skip
    out = tmp_path / "calib"
    assert bench.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    assert "does not grow with the work" in capsys.readouterr().err
    assert not out.with_suffix(".json").exists()
    report = json.loads(out.with_name("calib-fits.json").read_text())
    assert report["calibration"]["error"].startswith("varpack calibrate refused the fit")
    assert set(bench.CANDIDATES) <= set(report["fits"])
    assert "refused the fit (exit" in out.with_suffix(".md").read_text()
