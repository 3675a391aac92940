"""The GPU benchmark's harness on the CPU: ``--quick`` sizes, a few rows, the report files.

The figures mean nothing here (a tiny model, two timed steps); what is checked is that the rows
run end to end (data, plans, reader, model steps, compile warm-up, ceiling, reader share) and
that rows the CPU cannot run say why instead of failing.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_gpu", None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA skip")
def test_without_cuda_it_skips_cleanly(bench, tmp_path, capsys) -> None:
    assert bench.main(["--quick", "--out", str(tmp_path / "gpu")]) == 0
    assert "no CUDA device here; skipped" in capsys.readouterr().out
    assert not (tmp_path / "gpu.json").exists()


def test_quick_rows_on_cpu(bench, tmp_path) -> None:
    out = tmp_path / "gpu"
    argv = ["--quick", "--device", "cpu", "--dtype", "fp32", "--compile-backend", "eager"]
    argv += ["--rows", "1,2,3,7,9"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    rows = list(report["rows"].values())
    names = list(report["rows"])
    assert len(rows) == 6 and names[-1].startswith("ceiling")  # 5 rows + the ceiling
    mask, varlen, flex, causal, static, ceiling = rows
    for r in (mask, causal, static, ceiling):
        assert r["status"] == "ok" and r["tokens_per_s"] > 0 and 0 <= r["padded_frac"] < 1
        assert r["tflops"] > 0 and "vs_ceiling" in r
    assert "needs a CUDA device" in varlen["status"] and "no CPU backward" in flex["status"]
    assert [r["attention"] for r in (mask, causal, static)] == ["mask", "causal", "mask"]
    assert static["recompiles"] == 0 and static["warmup_compile_s"] > 0
    assert ceiling["padded_frac"] == 0.0 and abs(ceiling["vs_ceiling"] - 1) < 1e-9
    assert report["ratios"]["best_varpack_row"] in names
    assert report["ratios"]["vs_padded_random_causal"] > 0
    assert report["reader"]["row"] == names[0] and "share" in report["reader"]
    table = out.with_suffix(".md").read_text()
    assert "| real tokens/s |" in table and "reader's share" in table
