"""The GPU calibration script on the CPU: real steps measured, CSV written, models fitted.

Timings on a shared CPU mean nothing (and are never asserted); the fit is checked on rows with
a known law, through the script's own CSV and ``varpack calibrate`` path.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402

from varpack.plan.cost import sample_flops  # noqa: E402
from varpack.plan.models import ModelDims  # noqa: E402
from varpack.torch.model import PRESETS, TinyGPT  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_calibrate_gpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_calibrate_gpu", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_calibrate_gpu"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_calibrate_gpu", None)


def test_measure_runs_real_steps(bench):
    model = TinyGPT(PRESETS["tiny"])
    rows = bench.measure(model, [16, 32], 1, torch.device("cpu"))
    assert [r[0] for r in rows] == [16, 32]
    assert all(r[1] is None and r[2] > 0 for r in rows)  # no allocator peak on the CPU


def test_cpu_path_fits_the_time_model(bench, tmp_path, monkeypatch, capsys):
    c = PRESETS["tiny"]
    dims = ModelDims(c.d_model, c.d_model, c.n_layers)

    def fake(model, sizes, reps, device):  # type: ignore[no-untyped-def]
        return [[t, None, 3e-9 * float(sample_flops([t], dims)[0]) + 0.01] for t in sizes]

    monkeypatch.setattr(bench, "measure", fake)
    out = tmp_path / "calib"
    assert bench.main(["--device", "cpu", "--preset", "tiny", "--out", str(out)]) == 0
    got = json.loads(out.with_suffix(".json").read_text())
    assert got["time_per_flop"] == pytest.approx(3e-9) and got["time_fixed"] == pytest.approx(0.01)
    assert got["held_out"] == 2 and got["time_error_held_out"]["max_pct"] < 1e-6
    assert "memory_per_token" not in got
    assert out.with_suffix(".csv").read_text().startswith("tokens,step_time")
    assert "time model: held-out error mean" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_without_cuda_it_says_so(bench, tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path / "x")]) == 0
    assert "no CUDA device" in capsys.readouterr().out
