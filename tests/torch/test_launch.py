"""Rank, world size and rendezvous from the launcher's environment: torchrun's, else srun's
(``varpack.torch.launch``), as PlanLoader and jobs/train.py read them; metrics.jsonl on resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch.nn")

from plan_helpers import make_plan, write_tokens  # noqa: E402

from varpack.errors import ConfigError  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402
from varpack.torch.job import MetricsLog  # noqa: E402
from varpack.torch.launch import (  # noqa: E402
    LaunchEnv,
    export_torch_env,
    first_host,
    launch_env,
    master_addr,
    master_port,
)

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No launcher variables at all (neither torchrun's nor Slurm's) until a test sets some; what
    the test (or ``export_torch_env``) sets is undone after it."""
    import os

    for name in {*LAUNCH_VARS, *(n for n in os.environ if n.startswith("SLURM_"))}:
        monkeypatch.setenv(name, "")  # recorded, so that the undo restores it (or removes it)
        monkeypatch.delenv(name)
    monkeypatch.setattr("shutil.which", lambda name: None)  # no scontrol: the parser answers
    return monkeypatch


def test_torchrun_first_then_slurm_then_one_process(env: pytest.MonkeyPatch) -> None:
    assert launch_env() == LaunchEnv(0, 1, 0, "none")
    env.setenv("SLURM_PROCID", "5")
    env.setenv("SLURM_NTASKS", "8")
    env.setenv("SLURM_LOCALID", "1")
    assert launch_env() == LaunchEnv(5, 8, 1, "slurm")
    env.setenv("RANK", "3")
    env.setenv("WORLD_SIZE", "4")
    assert launch_env() == LaunchEnv(3, 4, 0, "torchrun")  # srun torchrun: torchrun's ranks
    env.setenv("WORLD_SIZE", "four")
    with pytest.raises(ConfigError, match="WORLD_SIZE='four' is not an integer"):
        launch_env()


def test_a_batch_script_is_not_a_task_of_a_step(env: pytest.MonkeyPatch) -> None:
    """sbatch's script has SLURM_PROCID=0 and the allocation's SLURM_NTASKS; only srun's tasks
    (SLURM_STEP_NUM_TASKS) are ranks, so a plain python there is one process, not 1 of 16."""
    env.setenv("SLURM_JOB_ID", "4242")
    env.setenv("SLURM_PROCID", "0")
    env.setenv("SLURM_NTASKS", "16")
    assert launch_env().launcher == "none"
    env.setenv("SLURM_STEP_NUM_TASKS", "16")
    assert launch_env() == LaunchEnv(0, 16, 0, "slurm")


def test_rendezvous_under_srun(env: pytest.MonkeyPatch) -> None:
    assert (master_addr(), master_port()) == ("127.0.0.1", 29500)
    env.setenv("SLURM_JOB_ID", "123456")
    env.setenv("SLURM_STEP_ID", "3")
    env.setenv("SLURM_JOB_NODELIST", "gpu[007-012,020],cpu3")
    env.setenv("SLURM_NNODES", "8")
    assert (master_addr(), master_port()) == ("gpu007", 10000 + 1456 * 10 + 3)
    env.setenv("SLURM_STEP_NODELIST", "gpu011")
    env.setenv("SLURM_STEP_NUM_NODES", "1")
    assert master_addr() == "127.0.0.1"  # the step runs on one node
    env.setenv("MASTER_ADDR", "10.0.0.9")
    env.setenv("MASTER_PORT", "6000")
    assert (master_addr(), master_port()) == ("10.0.0.9", 6000)  # the script's choice wins
    assert first_host("n-a,n-b") == "n-a" and first_host("x[1-2]-ib") == "x1-ib"


def test_export_gives_torch_what_env_init_reads(env: pytest.MonkeyPatch) -> None:
    import os

    env.setenv("SLURM_PROCID", "1")
    env.setenv("SLURM_NTASKS", "2")
    env.setenv("SLURM_LOCALID", "1")
    export_torch_env(launch_env())
    got = {k: os.environ.get(k) for k in LAUNCH_VARS}
    assert got == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip


def test_plan_loader_takes_its_rank_from_slurm(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lens = {i: 3 + i % 5 for i in range(16)}
    write_tokens(tmp_path / "t.parquet", list(lens), list(lens.values()))
    plan = make_plan(tmp_path / "plan", lens, dp=2, grad_accum=1, budget=16)
    data = ParquetTokenDataset(tmp_path / "t.parquet")
    env.setenv("SLURM_PROCID", "1")
    env.setenv("SLURM_NTASKS", "2")
    loader = PlanLoader(plan, data)
    assert (loader.rank, loader.world_size) == (1, 2)
    assert [b.sample_ids.tolist() for b in loader] == [
        b.sample_ids.tolist() for b in PlanLoader(plan, data, rank=1)
    ]
    env.setenv("SLURM_NTASKS", "3")
    with pytest.raises(Exception, match="dp=2 .* world size 3"):
        PlanLoader(plan, data)


def test_metrics_log_appends_on_resume_and_drops_steps_trained_again(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = MetricsLog(path, None, enabled=True)
    for step in (1, 2, 3, 4):
        first.write({"step": step, "loss": 1.0 / step})
    first.close()
    with path.open("a") as f:
        f.write('{"step": 5, "lo')  # a line cut by a crash
    resumed = MetricsLog(path, 2, enabled=True)  # the checkpoint holds step 2
    resumed.write({"step": 3, "loss": 0.5})
    resumed.close()
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]
    MetricsLog(path, None, enabled=True).close()  # a new run starts the file
    assert path.read_text() == ""
    MetricsLog(tmp_path / "rank1.jsonl", None, enabled=False).close()  # rank 1 writes nothing
    assert not (tmp_path / "rank1.jsonl").exists()
