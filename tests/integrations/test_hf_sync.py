"""The trainer's synchronisation, read from ``accelerate``'s state (accelerate's own plugin objects
in stand-in states: no launcher, no DeepSpeed installed), against the plan's ``sync``:
``VarpackTrainer`` and a plain accelerate loop warn once, on rank 0, when a ``--sync step`` plan
meets sharded parameters; a ``micro`` plan under DDP is an informative log line only."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch.nn")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from accelerate.utils import (  # noqa: E402
    DeepSpeedPlugin,
    DistributedType,
    FullyShardedDataParallelPlugin,
)
from hf_helpers import ROOT, gpt_loss, make_plans, tiny_gpt  # noqa: E402
from plan_helpers import torchrun  # noqa: E402
from testkit import cli  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402

import varpack.integrations.sync as sync_mod  # noqa: E402
from varpack.errors import ConfigError  # noqa: E402
from varpack.integrations.accelerate import check_sync  # noqa: E402
from varpack.integrations.hf import VarpackTrainer  # noqa: E402
from varpack.integrations.sync import (  # noqa: E402
    PlanSyncWarning,
    Strategy,
    StrategyWarning,
    running,
    strategy,
)
from varpack.integrations.world import Launched  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402

pytestmark = pytest.mark.torch
LOGGER = "varpack.integrations.sync"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """make_plans' tokens and (micro) plans, and a dp 2 plan balanced per step."""
    out: dict[str, Any] = make_plans(tmp_path_factory.mktemp("hf_sync"))
    out["step"] = out["tmp"] / "plan-step"
    cli("plan", out["tmp"] / "meta", out["step"], "--dp", 2, "--grad-accum", 2, "--max-tokens",
        96, "--order", "shuffle", "--seed", 3, "--sync", "step", "-q")  # fmt: skip
    return out


def loader(data: dict[str, Any], name: str) -> PlanLoader:
    """Rank 0 of the plan, read by this one process."""
    return PlanLoader(data[name], ParquetTokenDataset(data["tokens"]), rank=0)


def fsdp2_module() -> nn.Module:
    """A module as ``fully_shard`` leaves it: its class made a subclass of ``FSDPModule``."""
    module = nn.Linear(2, 2)
    module.__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})
    return module


class Raising:
    """A DeepSpeed state with no active plugin: accelerate's property raises ValueError."""

    distributed_type = DistributedType.DEEPSPEED
    num_processes = 4

    @property
    def deepspeed_plugin(self) -> Any:
        raise ValueError("no active DeepSpeedPlugin")


def state(kind: Any, world: int = 8, **kw: Any) -> SimpleNamespace:
    return SimpleNamespace(distributed_type=kind, num_processes=world, **kw)


FSDP = DistributedType.FSDP
DS = DistributedType.DEEPSPEED
CASES = [
    (state(FSDP, fsdp_plugin=FullyShardedDataParallelPlugin()), None, ("micro", "FSDP", 8)),
    (
        state(FSDP, 2, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)),
        None,
        ("micro", "FSDP2", 2),
    ),  # fmt: skip
    (
        state(FSDP, fsdp_plugin=FullyShardedDataParallelPlugin(sharding_strategy="NO_SHARD")),
        None,
        ("step", "FSDP with NO_SHARD", 8),
    ),  # fmt: skip
    (state("FSDP"), None, ("micro", "FSDP", 8)),  # a plain string, no plugin to read
    (
        state(DS, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3)),
        None,
        ("micro", "DeepSpeed ZeRO-3", 8),
    ),  # fmt: skip
    (
        state(DS, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2)),
        None,
        ("step", "DeepSpeed ZeRO-2", 8),
    ),  # fmt: skip
    (
        state(DS, deepspeed_plugin=DeepSpeedPlugin(zero_stage=1)),
        None,
        ("step", "DeepSpeed ZeRO-1", 8),
    ),  # fmt: skip
    (
        state(
            DS,
            deepspeed_plugin=SimpleNamespace(
                zero_stage=None, deepspeed_config={"zero_optimization": {"stage": 3}}
            ),
        ),
        None,
        ("micro", "DeepSpeed ZeRO-3", 8),
    ),  # fmt: skip
    (state(DS, deepspeed_plugin=SimpleNamespace(zero_stage="auto")), None, (None, "DeepSpeed", 8)),
    (Raising(), None, (None, "DeepSpeed", 4)),
    (state(DistributedType.MULTI_GPU, 4), None, ("step", "DDP", 4)),
    (
        state(DistributedType.MULTI_GPU, 4),
        SimpleNamespace(module=fsdp2_module()),
        ("micro", "FSDP", 4),
    ),  # fmt: skip
    (state("MULTI_CPU", 2), nn.Linear(2, 2), ("step", "DDP", 2)),
    (state(DistributedType.NO, 1), None, ("step", "one process", 1)),
    (state(DistributedType.MEGATRON_LM, 4), None, ("step", "Megatron-LM", 4)),
    (state(DistributedType.XLA, 4), None, (None, "XLA", 4)),
    (SimpleNamespace(), None, ("step", "one process", 1)),  # nothing readable: one process
]


@pytest.mark.parametrize(("st", "model", "want"), CASES)
def test_strategy_from_accelerate_state(st: Any, model: Any, want: tuple) -> None:
    assert strategy(st, model) == Strategy(*want)


def fake_accelerator(kind: Any, world: int, rank: int = 0, **kw: Any) -> SimpleNamespace:
    return SimpleNamespace(state=state(kind, world, process_index=rank, **kw))


def test_a_step_plan_under_sharding_warns_on_rank_0_only(data: dict[str, Any]) -> None:
    step = loader(data, "step")
    times = step.plan.meta["stats"]["time_vs_ideal_by_sync"]
    sharded = {"fsdp_plugin": FullyShardedDataParallelPlugin()}
    with pytest.warns(PlanSyncWarning) as said:
        got = check_sync(fake_accelerator(FSDP, 2, **sharded), step)
    assert len(said) == 1 and got is not None and got.harmful
    line = str(said[0].message)
    assert line == got.text and "\n" not in line and "but FSDP meets at every micro-batch" in line
    assert f"takes {times['micro']:.3f}x the ideal time, not the {times['step']:.3f}x" in line
    assert f"varpack replan {data['step']} OUT --from-step S --sync micro" in line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        assert check_sync(fake_accelerator(FSDP, 2, rank=1, **sharded), step) == got  # silent
        assert check_sync(fake_accelerator(FSDP, 1, **sharded), step) is None  # no one waits
        ddp = fake_accelerator(DistributedType.MULTI_GPU, 2)
        assert check_sync(ddp, step) is None  # the plan's own model
    with pytest.warns(PlanSyncWarning, match="but FSDP meets"):  # FSDP2 on the model, by hand
        assert check_sync(ddp, step, SimpleNamespace(module=fsdp2_module())) == got


def test_a_micro_plan_under_ddp_is_a_log_line(
    data: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    micro = loader(data, "dp2")
    times = micro.plan.meta["stats"]["time_vs_ideal_by_sync"]
    caplog.set_level(logging.INFO, logger=LOGGER)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = check_sync(fake_accelerator(DistributedType.MULTI_GPU, 2), micro)
        check_sync(fake_accelerator(DistributedType.MULTI_GPU, 2, rank=1), micro)
        assert check_sync(fake_accelerator(FSDP, 2), micro) is None  # what it was planned for
    assert got is not None and not got.harmful
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert [(r.levelno, r.getMessage()) for r in lines] == [(logging.INFO, got.text)]  # rank 0
    bound = micro.plan.meta["stats"]["time_vs_ideal_bound"]
    assert got.text.endswith(
        f"balanced there too ({times['step']:.3f}x ideal; {times['micro']:.3f}x under micro; "
        f"no composition of its samples into as many steps below {bound:.3f}x)"
    )  # the plan's own figures only: nothing said of a --sync step plan it has not measured
    assert "--sync step" not in got.text.split("but DDP")[1]


def test_the_trainer_warns_once_when_built(
    data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built on one process (accelerate's real state): nothing to say. Built where the state
    says FSDP over 2 processes (the detection stood in for): one warning, before training."""
    args = transformers.TrainingArguments(str(tmp_path / "run"), report_to="none",
                                          disable_tqdm=True, use_cpu=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanSyncWarning)
        trainer = VarpackTrainer(tiny_gpt(), args, plan_loader=loader(data, "step"),
                                 loss_fn=gpt_loss)  # fmt: skip
    assert strategy(trainer.accelerator.state, trainer.model) == ("step", "one process", 1)
    calls: list[Any] = []

    def sharded(st: Any, model: Any = None) -> Strategy:
        calls.append(st)
        return Strategy("micro", "FSDP", 2)

    monkeypatch.setattr(sync_mod, "strategy", sharded)
    with pytest.warns(PlanSyncWarning, match=r"but FSDP meets at every micro-batch") as said:
        trainer = VarpackTrainer(tiny_gpt(), args, plan_loader=loader(data, "step"),
                                 loss_fn=gpt_loss)  # fmt: skip
    assert len(said) == 1 and calls == [trainer.accelerator.state]


def ddp_module() -> nn.Module:
    """A module as ``DistributedDataParallel`` wraps one (by class name: no process group)."""
    wrapper = type("DistributedDataParallel", (nn.Module,), {})()
    wrapper.module = nn.Linear(2, 2)
    return wrapper


@pytest.mark.parametrize(
    ("st", "want"),
    [
        (state("MULTI_CPU", 2, fsdp_plugin=FullyShardedDataParallelPlugin()), ("step", "DDP", 2)),
        (
            state(DistributedType.NO, 1, fsdp_plugin=FullyShardedDataParallelPlugin()),
            ("step", "one process", 1),
        ),  # fmt: skip
        (
            state(DistributedType.MULTI_GPU, 4, fsdp_plugin=FullyShardedDataParallelPlugin()),
            ("step", "DDP", 4),
        ),  # fmt: skip
    ],
)
def test_a_plugin_the_state_does_not_run_counts_for_nothing(st: Any, want: tuple) -> None:
    """accelerate sets FSDP up on accelerators only: a plugin next to NO / MULTI_* is not run."""
    assert strategy(st) == Strategy(*want)


def two_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sync_mod, "launched", lambda: Launched(2, "torch.distributed has 2 processes", "x")
    )


def test_one_process_of_accelerate_in_a_job_of_two_is_what_the_model_says(
    data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Accelerator() under torchrun on the CPU: its state says one process, the process group
    two. A model wrapped by hand tells what runs; an unwrapped (or no) model is refused."""
    two_processes(monkeypatch)
    alone = state(DistributedType.NO, 1)
    assert running(alone, ddp_module()) == Strategy("step", "DDP", 2)
    assert running(alone, SimpleNamespace(module=fsdp2_module())) == Strategy("micro", "FSDP", 2)
    assert running(state("MULTI_CPU", 2), nn.Linear(2, 2)) == Strategy("step", "DDP", 2)
    for model, told in ((nn.Linear(2, 2), "the model is not wrapped for data parallelism"),
                        (None, "no model was given to check_sync")):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            check_sync(SimpleNamespace(state=alone), loader(data, "step"), model)
        assert str(err.value).startswith(
            "torch.distributed has 2 processes, but accelerate set itself up as one process "
            f"(distributed_type NO) and {told}: each process would train a model of its own, "
            "no gradient averaged; on the CPU give Accelerator(cpu=True)"
        )
    with pytest.warns(PlanSyncWarning, match="but FSDP meets at every micro-batch"):
        check_sync(SimpleNamespace(state=alone), loader(data, "step"),
                   SimpleNamespace(module=fsdp2_module()))  # fmt: skip


def test_fsdp_asked_and_ddp_run_is_a_warning_on_rank_0(
    data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """TrainingArguments(fsdp=...) or accelerate launch --use_fsdp on the CPU: DDP runs. The
    warning says so, and the plan is held to DDP (a micro plan: the log line, not silence)."""
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    micro, step = loader(data, "dp2"), loader(data, "step")
    cpu = fake_accelerator("MULTI_CPU", 2)
    caplog.set_level(logging.INFO, logger=LOGGER)
    with pytest.warns(StrategyWarning) as said:
        got = check_sync(cpu, micro, nn.Linear(2, 2), "FSDP")
    assert [str(w.message) for w in said] == [
        "FSDP was asked, but DDP runs over 2 processes (accelerate's distributed_type "
        "MULTI_CPU) (accelerate sets FSDP up on accelerators only): its ranks meet once per "
        "optimizer step and each holds the whole model; the plan's sync is held to what runs"
    ]
    assert (
        got is not None and not got.harmful and "but DDP meets once per optimizer step" in got.text
    )
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [got.text]
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # accelerate launch --use_fsdp
    with pytest.warns(StrategyWarning, match="^FSDP was asked, but DDP runs over 2 processes"):
        assert check_sync(cpu, step) is None  # a step plan: DDP's own, nothing more to say
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_sync(fake_accelerator("MULTI_CPU", 2, rank=1), micro, None, "FSDP")  # rank 1
        check_sync(fake_accelerator(FSDP, 2, fsdp_plugin=FullyShardedDataParallelPlugin()),
                   micro, None, "FSDP")  # FSDP runs  # fmt: skip
        monkeypatch.delenv("ACCELERATE_USE_FSDP")
        check_sync(cpu, step)  # nothing asked


@pytest.mark.slow
def test_under_torchrun_on_the_cpu_what_runs_is_checked(data: dict[str, Any]) -> None:
    """Two gloo processes: Accelerator() (one process each) refused on both ranks; cpu=True
    (DDP) silent for a step plan; VarpackTrainer with fsdp="full_shard" warns once, on rank 0,
    that DDP runs."""
    out = data["tmp"] / "torchrun-sync"
    out.mkdir()
    worker = ROOT / "tests" / "integrations" / "hf_sync_worker.py"
    torchrun(2, worker, data["step"], data["dp2"], data["tokens"], out, timeout=400)
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for seen in got:
        kind, line = seen["plain"]
        assert kind == "ConfigError" and line.startswith(
            "torch.distributed has 2 processes, but accelerate set itself up as one process"
        )
        assert seen["cpu"] == {"strategy": ["step", "DDP", 2], "advice": None, "warned": []}
    assert got[0]["trainer"] == [
        "StrategyWarning: FSDP was asked, but DDP runs over 2 processes (accelerate's "
        "distributed_type MULTI_CPU) (accelerate sets FSDP up on accelerators only): its ranks "
        "meet once per optimizer step and each holds the whole model; the plan's sync is held "
        "to what runs"
    ]
    assert got[1]["trainer"] == []  # rank 0 says it
