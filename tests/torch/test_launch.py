"""Rank, world size and rendezvous from the launcher's environment: torchrun's, else srun's
(``varpack.torch.launch``), as PlanLoader and jobs/train.py read them, refused when they cannot
make a job; metrics.jsonl on resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch.nn")

from plan_helpers import make_plan, write_tokens  # noqa: E402

from varpack.errors import ConfigError  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402
from varpack.torch.launch import (  # noqa: E402
    LaunchEnv,
    LaunchError,
    best_rank,
    cuda_index,
    export_torch_env,
    first_host,
    launch_env,
    master_addr,
    master_port,
    rendezvous,
)
from varpack.torch.records import MetricsLog  # noqa: E402

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


@pytest.mark.parametrize(
    ("variables", "message", "own"),
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not", False),
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not", False),
        ({"RANK": "2", "WORLD_SIZE": "2"}, r"RANK=2 is not below WORLD_SIZE=2 \(the ranks are 0 .. 1\)", True),
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2"}, "LOCAL_RANK=2 does not fit RANK=1", True),
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
         "LOCAL_RANK=2 does not fit LOCAL_WORLD_SIZE=2", True),
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "2"}, "SLURM_PROCID=3 is not below SLURM_NTASKS=2", True),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "3"},
         "SLURM_LOCALID=3 does not fit SLURM_PROCID=1", True),
        ({"SLURM_JOB_ID": "9", "SLURM_PROCID": "2", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "2"},
         "SLURM_PROCID=2 is not below SLURM_STEP_NUM_TASKS=2", True),
    ],
)  # fmt: skip
def test_a_launch_that_cannot_make_a_job_is_refused(
    env: pytest.MonkeyPatch, variables: dict[str, str], message: str, own: bool
) -> None:
    for name, value in variables.items():
        env.setenv(name, value)
    with pytest.raises(LaunchError, match=message) as err:
        launch_env()
    assert err.value.own is own  # about this process alone: it says so; else rank 0 speaks
    assert "\n" not in str(err.value) and ("launch" in str(err.value) or "unset" in str(err.value))


def test_a_task_of_a_step_counts_the_steps_tasks(env: pytest.MonkeyPatch) -> None:
    env.setenv("SLURM_JOB_ID", "9")
    env.setenv("SLURM_PROCID", "3")
    env.setenv("SLURM_NTASKS", "16")  # the allocation's
    env.setenv("SLURM_STEP_NUM_TASKS", "4")  # srun --ntasks 4 inside it
    assert launch_env() == LaunchEnv(3, 4, 0, "slurm")


def test_the_rendezvous_needs_an_address_and_a_port(env: pytest.MonkeyPatch) -> None:
    one, two = LaunchEnv(0, 1, 0, "none"), LaunchEnv(1, 2, 1, "torchrun")
    assert rendezvous(one) == ("127.0.0.1", 29500)  # one process meets nobody
    with pytest.raises(LaunchError, match="MASTER_ADDR and MASTER_PORT are not set") as err:
        rendezvous(two)
    assert not err.value.own
    env.setenv("MASTER_ADDR", "node7")
    with pytest.raises(LaunchError, match="WORLD_SIZE=2 but MASTER_PORT is not set"):
        rendezvous(two)
    env.setenv("MASTER_PORT", "70000")
    with pytest.raises(LaunchError, match="MASTER_PORT=70000 is not a port"):
        rendezvous(two)
    env.setenv("MASTER_PORT", "6000")
    assert rendezvous(two) == ("node7", 6000)


def test_each_local_rank_takes_its_own_gpu() -> None:
    assert [cuda_index(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert cuda_index(5, 1) == 0  # srun --gpus-per-task 1: each task sees its one GPU
    with pytest.raises(LaunchError, match="local rank 5 but this node shows 4 GPUs") as err:
        cuda_index(5, 4)  # two ranks would share a GPU (NCCL refuses, after the rendezvous)
    assert err.value.own


def test_who_speaks_for_a_job_whose_environment_is_wrong(env: pytest.MonkeyPatch) -> None:
    assert best_rank() == 0
    env.setenv("SLURM_PROCID", "3")
    assert best_rank() == 3
    env.setenv("RANK", "x")  # unreadable: the next launcher's word
    assert best_rank() == 3
    env.setenv("RANK", "2")
    assert best_rank() == 2
