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


@pytest.mark.slow
def test_quick_rows_on_cpu(bench, tmp_path) -> None:
    out = tmp_path / "gpu"
    argv = ["--quick", "--device", "cpu", "--dtype", "fp32", "--compile-backend", "eager"]
    argv += ["--rows", "1,2,3,7,9"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    rows = list(report["rows"].values())
    names = list(report["rows"])
    assert len(rows) == 7  # 5 rows and the two references, eager and compiled
    mask, varlen, flex, causal, static, reference, compiled_ref = rows
    assert names[-2].startswith("reference") and names[-1].endswith("--compile static")
    for r in (mask, causal, static, reference, compiled_ref):
        assert r["status"] == "ok" and r["tokens_per_s"] > 0 and 0 <= r["padded_frac"] < 1
        assert r["tflops"] > 0 and "vs_reference" in r
    assert "needs a CUDA device" in varlen["status"] and "no CPU backward" in flex["status"]
    assert [r["attention"] for r in (mask, causal, static)] == ["mask", "causal", "mask"]
    assert static["recompiles"] == 0 and static["warmup_compile_s"] > 0
    # each row against the reference of its own compile mode
    for r, ref in ((mask, reference), (causal, reference), (static, compiled_ref)):
        assert r["vs_reference"] == pytest.approx(r["tokens_per_s"] / ref["tokens_per_s"])
    assert reference["padded_frac"] == 0.0 and reference["vs_reference"] == pytest.approx(1)
    assert compiled_ref["vs_reference"] == pytest.approx(1)
    assert report["ratios"]["best_varpack_row"] in names
    # the padded baselines are eager: compared with the best eager varpack row, not a compiled one
    assert report["ratios"]["best_eager_row"] == names[0]
    assert report["ratios"]["vs_padded_random_causal"] == pytest.approx(
        mask["tokens_per_s"] / causal["tokens_per_s"]
    )
    assert report["reader"]["row"] == names[0] and "share" in report["reader"]
    assert report["workers"] == 0  # no GPU: the default takes no DataLoader worker
    table = out.with_suffix(".md").read_text()
    assert "| real tokens/s |" in table and "reader's share" in table
    assert "| vs reference |" in table and "not a bound" in table


def test_out_of_memory_is_said_so(bench, tmp_path, monkeypatch) -> None:
    """A baseline that does not fit the budget is "OOM at this budget", not an error; the
    rows after it still run."""

    def oom(b, row, plan, preload=False):  # type: ignore[no-untyped-def]
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.47 GiB. GPU 0 has")

    monkeypatch.setattr(bench, "run_row", oom)
    out = tmp_path / "gpu"
    argv = ["--quick", "--device", "cpu", "--dtype", "fp32", "--rows", "6", "--out", str(out)]
    assert bench.main(argv) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    row, reference = report["rows"].values()
    assert row["status"] == "OOM at this budget"
    assert row["detail"] == "CUDA out of memory. Tried to allocate 7.47 GiB"
    assert reference["status"] == "ok"
    assert "| OOM at this budget (CUDA out of memory." in out.with_suffix(".md").read_text()


def test_the_time_budget_counts_from_the_start(bench, tmp_path) -> None:
    """With no time left after the data and plans, every row says it was skipped."""
    out = tmp_path / "gpu"
    argv = ["--quick", "--device", "cpu", "--rows", "1", "--time-budget", "0", "--out", str(out)]
    assert bench.main(argv) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert {r["status"] for r in report["rows"].values()} == {"skipped: time budget"}
    assert report["reader"]["status"] == "skipped: time budget"
