"""DataLoader workers by default: from the CPUs per training process; none without CUDA."""

from __future__ import annotations

import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from plan_helpers import make_plan, random_lengths, write_tokens  # noqa: E402

from varpack.errors import ConfigError  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402
from varpack.torch.workers import MAX_WORKERS, default_workers, resolve_workers  # noqa: E402


@pytest.mark.parametrize(
    ("gpus", "cpus", "local", "want"),
    [
        (1, 16, None, MAX_WORKERS),  # the measured H100 box: 6 (0.4 % of the loop)
        (8, 32, None, 2),  # 4 CPUs per GPU: two for the process, two workers
        (8, 208, None, MAX_WORKERS),
        (8, 16, None, 0),  # 2 CPUs per GPU: no room for a worker
        (8, 64, "4", 6),  # torchrun's LOCAL_WORLD_SIZE counts the processes, not the GPUs
        (8, 64, "16", 2),
        (0, 64, None, 0),  # no GPU: the model needs every core
    ],
)
def test_workers_follow_the_cpus_per_process(monkeypatch, gpus, cpus, local, want) -> None:
    if local is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    assert default_workers(gpus=gpus, cpus=cpus) == want


def test_auto_without_cuda_is_no_worker(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_workers("auto") == 0


@pytest.mark.parametrize("bad", ["many", -1, 2.0, True])
def test_a_worker_count_that_means_nothing_is_one_line(bad) -> None:
    with pytest.raises(ConfigError, match=r"^num_workers=.*give a count >= 0 or 'auto'") as err:
        resolve_workers(bad)
    assert "\n" not in str(err.value)


def test_the_loader_takes_auto(tmp_path, rng, monkeypatch) -> None:
    lens = random_lengths(rng, 20, 2, 30)
    write_tokens(tmp_path / "tok.parquet", list(lens), list(lens.values()))
    plan = make_plan(tmp_path / "plan", lens, dp=1, grad_accum=1, budget=64, pad_multiple=8)
    data = ParquetTokenDataset(tmp_path / "tok.parquet")
    monkeypatch.setattr("varpack.torch.workers.default_workers", lambda: 3)
    assert PlanLoader(plan, data, rank=0, num_workers="auto").num_workers == 3
    assert PlanLoader(plan, data, rank=0).num_workers == 0  # the default is unchanged
    with pytest.raises(ConfigError, match="num_workers='four'"):
        PlanLoader(plan, data, rank=0, num_workers="four")
