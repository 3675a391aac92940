"""``VarpackTrainer``'s processes are the launcher's and the loader's: one model, or one line
before training.

- torchrun, two processes on the CPU, the README's arguments exactly (no ``use_cpu``) and loaders
  made without ``rank=``: one DDP model over gloo (the same weights on both ranks after the steps,
  moved from the initial ones; the same logged losses), a checkpoint with the loader's cursor.
  Then, in the same process group, each wrong set-up is one line on every rank, before training:
  loaders told ``rank=0`` (only rank 1 is wrong), a model vocabulary smaller than the data's ids,
  a dp 1 plan.
- In one process, with the launcher's variables set and stand-ins for ``TrainingArguments`` (a
  real set-up would wait for peers that never come): each world the Trainer cannot join is one
  line naming what to set; on the CPU the set-up is done again with ``use_cpu=True``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.nn")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from hf_helpers import ROOT, make_plans  # noqa: E402
from plan_helpers import torchrun  # noqa: E402

from varpack.errors import ConfigError  # noqa: E402
from varpack.integrations.hf import LOADER_STATE  # noqa: E402
from varpack.integrations.world import check_world, launched, settle_world  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402

pytestmark = pytest.mark.torch
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
               "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_NUM_TASKS")  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_plans(tmp_path_factory.mktemp("hf_world"))


@pytest.mark.slow
def test_torchrun_with_the_readme_arguments_trains_one_model(data: dict[str, Path]) -> None:
    out = data["tmp"] / "torchrun"
    out.mkdir()
    torchrun(2, ROOT / "tests" / "integrations" / "hf_world_worker.py", data["dp2"], data["dp1"],
             data["tokens"], out, timeout=400)  # fmt: skip
    got = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for r, seen in enumerate(got):
        assert seen["rank"] == r and seen["trainer"] == (2, r, True), seen["trainer"]
        assert seen["wrapped"] == "DistributedDataParallel"
    assert list(got[0]["losses"]) == [1, 2] and got[0]["losses"] == got[1]["losses"]
    one, two = got[0]["weights"], got[1]["weights"]
    assert one.keys() == two.keys()
    for k in one:
        assert torch.equal(one[k], two[k]), k  # one model: DDP kept the ranks equal
    assert sum(not torch.equal(one[k], got[0]["initial"][k]) for k in one) > len(one) // 2
    assert (out / "hf-run" / "checkpoint-2" / LOADER_STATE).is_file()

    refused = [seen["refused"] for seen in got]
    assert refused[0] == refused[1]  # every rank says the same line, none waits for another
    kind, line = refused[0]["loader_rank0"]
    assert kind == "JobError" and "this process is rank 1 of 2, its PlanLoader reads rank 0" in line
    kind, line = refused[0]["small_vocab"]
    assert (
        kind == "JobError" and "vocabulary has 64 entries" in line and "config.vocab_size" in line
    )
    kind, line = refused[0]["dp1_plan"]
    assert kind == "InputError" and "dp=1" in line and "world size 2" in line
    for _, line in refused[0].values():
        assert "\n" not in line
    assert not (out / "rank0").exists() and not (out / "vocab").exists()  # refused before a write


class Args:
    """A stand-in for ``TrainingArguments``: what ``settle_world`` reads, and a device set-up
    (a cached property, as transformers') that reaches ``joins`` processes with ``use_cpu``."""

    def __init__(self, device: str = "cpu", world: int = 1, joins: int = 2, **kw: Any) -> None:
        self.device, self.world_size, self.joins = torch.device(device), world, joins
        self.process_index, self.n_gpu, self.setups = 0, 0, 0
        self.use_cpu, self.ddp_backend, self.deepspeed = False, None, None
        self.dataloader_pin_memory = True
        self.__dict__.update(kw)

    @functools.cached_property
    def _setup_devices(self) -> torch.device:
        self.setups += 1
        if self.use_cpu:
            self.world_size = self.joins
        return self.device


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set the launcher's variables (all others unset, everything restored afterwards)."""
    for name in LAUNCH_VARS:  # set, then unset: either way the original comes back
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)

    def set_env(**env: str) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return set_env


TORCHRUN = dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
SRUN = dict(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_LOCALID="1", SLURM_STEP_NUM_TASKS="2")


def test_on_the_cpu_the_trainer_is_set_up_again_for_every_process(launcher: Any) -> None:
    launcher(**TORCHRUN)
    args = Args()
    settle_world(args)
    assert (args.use_cpu, args.world_size, args.setups, args.dataloader_pin_memory) == (
        True, 2, 1, False)  # fmt: skip
    settle_world(args)  # agreed: nothing more
    assert args.setups == 1


def test_under_srun_alone_the_cpu_set_up_exports_the_rendezvous(launcher: Any) -> None:
    import os

    launcher(**SRUN)
    assert launched().how == "srun started 2 tasks"
    args = Args()
    settle_world(args)
    assert args.world_size == 2 and (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("1", "2")
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("env", "args", "says"),
    [
        # the set-up done again still finds one process (e.g. a group made by hand)
        (TORCHRUN, dict(joins=1), "give TrainingArguments(use_cpu=True)"),
        # a backend the CPU cannot run: not changed behind the user's back
        (TORCHRUN, dict(ddp_backend="nccl"), "give TrainingArguments(use_cpu=True)"),
        # use_cpu given already, and still one process
        (TORCHRUN, dict(use_cpu=True, joins=1), "give TrainingArguments(use_cpu=True)"),
        # a device accelerate runs no DDP on: its set-up is not the CPU's to redo
        (TORCHRUN, dict(device="mps"), "launch with torchrun (it sets LOCAL_RANK"),
        # GPUs under srun alone: accelerate sees no LOCAL_RANK
        (SRUN, dict(device="cuda"), "call varpack.torch.launch.export_torch_env(launch_env())"),
        # more Trainer processes than the launcher started
        (
            TORCHRUN,
            dict(world=4),
            "torchrun started 2 processes but the Trainer set itself up for 4",
        ),
    ],
)
def test_a_world_the_trainer_cannot_join_is_one_line(
    launcher: Any, env: dict[str, str], args: dict[str, Any], says: str
) -> None:
    launcher(**env)
    stand_in = Args(**args)
    with pytest.raises(ConfigError) as err:
        settle_world(stand_in)
    line = str(err.value)
    assert says in line and "\n" not in line
    assert "a model of its own" in line or args.get("world") == 4
    assert stand_in.setups == (1 if args.get("joins") == 1 and not args.get("use_cpu") else 0)


def test_one_process_needs_nothing(launcher: Any) -> None:
    args = Args()
    settle_world(args)  # no launcher
    launcher(RANK="0", WORLD_SIZE="1")
    settle_world(args)
    assert (args.use_cpu, args.setups) == (False, 0)


def test_the_loader_must_read_the_trainers_rank(data: dict[str, Path], launcher: Any) -> None:
    tokens = ParquetTokenDataset(data["tokens"])
    rank0 = PlanLoader(data["dp2"], tokens, rank=0)
    with pytest.raises(ConfigError, match="rank 1 of 2, its PlanLoader reads rank 0 of 2") as err:
        check_world(Args(world=2, process_index=1), rank0)
    assert "\n" not in str(err.value)
    rank1 = PlanLoader(data["dp2"], tokens, rank=1)
    check_world(Args(world=2, process_index=1), rank1)
    check_world(Args(world=1), rank1)  # one process replaying one rank of the plan
    with pytest.raises(ConfigError, match="2 GPUs in one process"):
        check_world(Args(n_gpu=2), rank1)
