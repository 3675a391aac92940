"""``VarpackTrainer`` (transformers.Trainer) and the accelerate loop train exactly as the reference
loops do on the same plan: per-step losses and final weights.

- TinyGPT: jobs/train.py itself is run in-process (its ``main``) on a dp 1 plan; its per-micro-batch
  losses are read by wrapping the module's ``normalise`` (its stdout shows 4 decimals only; its
  metrics.jsonl, where present, must agree) and its final weights from its checkpoint.pt. The
  Trainer and the accelerate loop must match both.
- A tiny Hugging Face Llama (sdpa): the README's loop (``hf_inputs`` + ``num_items_in_batch``).
- Resume: a Trainer stopped at a checkpoint and resumed ends as the uninterrupted run.
- DDP: two gloo processes (torchrun) on a dp 2 plan against a one-process reference that
  accumulates both ranks' micro-batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch.nn")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import sys  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch"))  # plan_helpers

import torch  # noqa: E402
from hf_helpers import (  # noqa: E402
    LR,
    ROOT,
    gpt_loss,
    gpt_micro,
    make_plans,
    reference,
    tiny_gpt,
    train_py,
    train_py_recipe,
    trainer_losses,
)
from plan_helpers import ranks  # noqa: E402

from varpack.errors import ConfigError, InputError  # noqa: E402
from varpack.integrations.accelerate import micro_step  # noqa: E402
from varpack.integrations.hf import LOADER_STATE, VarpackTrainer  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader, VariableBatchSizeLR  # noqa: E402
from varpack.torch.checkpoint import load_checkpoint  # noqa: E402
from varpack.torch.hf import hf_inputs  # noqa: E402

pytestmark = pytest.mark.torch
RTOL = 1e-5


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tokens and two real plans (``varpack plan``): dp 1 and dp 2, grad-accum 2, shuffled, an
    LR factor per step (its tokens / 160)."""
    return make_plans(tmp_path_factory.mktemp("hf_trainer"))


def _loader(data: dict[str, Path], dp: int = 1, **kw: Any) -> PlanLoader:
    return PlanLoader(data[f"dp{dp}"], ParquetTokenDataset(data["tokens"]), **kw)


def _args(out: Path, **kw: Any) -> Any:
    base = dict(logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True)
    return transformers.TrainingArguments(output_dir=str(out), use_cpu=True, **{**base, **kw})


def _assert_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=RTOL, atol=atol), (k, (a[k] - b[k]).abs().max())


@pytest.fixture(scope="module")
def train_py_run(data: dict[str, Path]) -> dict[str, Any]:
    """jobs/train.py's main on the dp 1 plan: per-step losses and final weights."""
    mod = train_py()
    seen: list[tuple[int, float]] = []
    normalise = mod.normalise

    def recording(loss_sum: torch.Tensor, batch: Any, world: int) -> torch.Tensor:
        loss = normalise(loss_sum, batch, world)
        seen.append((batch.step, float(loss.detach())))
        return loss

    mod.normalise = recording  # train.py's micro_loss looks it up at call time
    out = data["tmp"] / "train-py"
    mod.main(["--plan", str(data["dp1"]), "--data", str(data["tokens"]), "--out", str(out),
              "--warmup-steps", "2", "--lr", str(LR), "--seed", "0"])  # fmt: skip
    steps = _loader(data).num_steps
    assert sorted({s for s, _ in seen}) == list(range(steps)), "train.py's losses not recorded"
    assert np.ptp(_loader(data).lr_factors()) > 0.05  # the plan's LR factors vary
    losses = [sum(v for s, v in seen if s == k) for k in range(steps)]
    metrics = out / "metrics.jsonl"  # train.py's own per-step record, where it writes one
    if metrics.is_file():
        logged = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
        np.testing.assert_allclose(logged, losses, rtol=1e-6)
    return {"losses": losses, "weights": load_checkpoint(out / "checkpoint.pt")["model"]}


def test_trainer_matches_jobs_train_py(data: dict[str, Path], train_py_run: dict[str, Any]) -> None:
    loader = _loader(data)
    model = tiny_gpt()
    opt, base = train_py_recipe(model, loader.num_steps)
    trainer = VarpackTrainer(model, _args(data["tmp"] / "t-a"), plan_loader=loader,
                             loss_fn=gpt_loss, optimizers=(opt, base))  # fmt: skip
    trainer.train()
    assert trainer.args.gradient_accumulation_steps == 2 and trainer.args.ignore_data_skip
    assert isinstance(trainer.lr_scheduler, VariableBatchSizeLR)
    losses = trainer_losses(trainer)
    assert list(losses) == list(range(1, loader.num_steps + 1))
    np.testing.assert_allclose(list(losses.values()), train_py_run["losses"], rtol=RTOL)
    _assert_weights(model.state_dict(), train_py_run["weights"], atol=1e-7)
    # the in-test reference loop (used for dp 2 below) is train.py's too
    model = tiny_gpt()
    ref = reference(data["dp1"], data["tokens"], model, *train_py_recipe(model, loader.num_steps),
                    gpt_micro)  # fmt: skip
    np.testing.assert_allclose(ref, train_py_run["losses"], rtol=RTOL)


def test_accelerate_loop_matches_jobs_train_py(
    data: dict[str, Path], train_py_run: dict[str, Any]
) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    loader = _loader(data)
    model = tiny_gpt()
    opt, base = train_py_recipe(model, loader.num_steps)
    sched = VariableBatchSizeLR(base, loader.lr_factors())
    model, opt = accelerator.prepare(model, opt)
    losses, total = [], 0.0
    for batch in loader:
        total += float(micro_step(accelerator, model, batch, loader.world_size, gpt_loss))
        assert accelerator.sync_gradients == batch.is_last_micro
        if batch.is_last_micro:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total)
            total = 0.0
    np.testing.assert_allclose(losses, train_py_run["losses"], rtol=RTOL)
    _assert_weights(model.state_dict(), train_py_run["weights"], atol=1e-7)
    bad = Accelerator(cpu=True, gradient_accumulation_steps=2)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=2"):
        micro_step(bad, model, next(iter(_loader(data))), 1, gpt_loss)


def _llama() -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(cfg)


def test_trainer_matches_the_readme_loop_on_a_hf_llama(data: dict[str, Path]) -> None:
    """Trainer's own AdamW and cosine schedule (warm-up 1) over the plan's steps, no clipping;
    the README's loop with the same optimizer and schedule."""
    loader = _loader(data)
    model = _llama()
    args = _args(data["tmp"] / "t-b", learning_rate=1e-3, optim="adamw_torch",
                 lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=0.0)  # fmt: skip
    trainer = VarpackTrainer(model, args, plan_loader=loader)
    trainer.train()
    losses = trainer_losses(trainer)

    model_ref = _llama()
    opt = torch.optim.AdamW(model_ref.parameters(), lr=1e-3, weight_decay=0.0)
    base = transformers.get_scheduler("cosine", opt, num_warmup_steps=1,
                                      num_training_steps=loader.num_steps)  # fmt: skip

    def readme(model: Any, batch: Any) -> torch.Tensor:  # the README's micro-batch, world 1
        out = model(**hf_inputs(batch, "sdpa", labels=True), num_items_in_batch=batch.label_tokens)
        return out.loss * loader.plan.dp

    ref = reference(data["dp1"], data["tokens"], model_ref, opt, base, readme, clip=None)
    assert list(losses) == list(range(1, len(ref) + 1))
    np.testing.assert_allclose(list(losses.values()), ref, rtol=RTOL)
    _assert_weights(model.state_dict(), model_ref.state_dict(), atol=1e-6)
    assert abs(ref[-1] - ref[0]) > 1e-3  # it trained


@pytest.mark.slow
def test_trainer_resume_is_exact(data: dict[str, Path]) -> None:
    """Interrupted after 3 steps with a checkpoint (a callback stops it; its max_steps, hence its
    schedule, is the full run's), resumed by a new Trainer (another initial model): the later
    losses and the final weights are the uninterrupted run's."""
    kw = dict(optim="adamw_torch", learning_rate=LR, lr_scheduler_type="cosine", warmup_steps=1)

    class StopAt(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            control.should_training_stop = state.global_step == 3

    def run(out: Path, seed: int, resume: bool = False, stop: bool = False) -> VarpackTrainer:
        more = dict(save_strategy="steps", save_steps=3) if stop else {}
        trainer = VarpackTrainer(tiny_gpt(seed), _args(out, **kw, **more), plan_loader=_loader(data),
                                 loss_fn=gpt_loss, callbacks=[StopAt()] if stop else None)  # fmt: skip
        trainer.train(resume_from_checkpoint=True if resume else None)
        return trainer

    full = run(data["tmp"] / "full", 0)
    out = data["tmp"] / "stopped"
    stopped = run(out, 0, stop=True)
    assert stopped.state.global_step == 3
    state = json.loads((out / "checkpoint-3" / LOADER_STATE).read_text())
    assert (state["step"], state["micro"]) == (3, 0)
    resumed = run(out, 7, resume=True)  # another init: the checkpoint's weights must be loaded
    a, b = trainer_losses(full), trainer_losses(resumed)
    assert list(a) == list(b) == list(range(1, len(a) + 1))
    np.testing.assert_allclose(list(b.values()), list(a.values()), rtol=RTOL)
    _assert_weights(resumed.model.state_dict(), full.model.state_dict(), atol=0)
    # a checkpoint without the loader cursor is refused in one line
    (out / "checkpoint-3" / LOADER_STATE).unlink()
    trainer = VarpackTrainer(tiny_gpt(), _args(out), plan_loader=_loader(data), loss_fn=gpt_loss)
    with pytest.raises(InputError, match=f"no {LOADER_STATE}"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-3"))


def test_trainer_refuses_options_the_plan_decides(data: dict[str, Path]) -> None:
    model = tiny_gpt()
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=3.*accumulates 2"):
        VarpackTrainer(model, _args(data["tmp"] / "x", gradient_accumulation_steps=3),
                       plan_loader=_loader(data), loss_fn=gpt_loss)  # fmt: skip
    steps = _loader(data).num_steps
    with pytest.raises(ConfigError, match=f"the plan has {steps} steps"):
        VarpackTrainer(model, _args(data["tmp"] / "x", max_steps=steps + 1),
                       plan_loader=_loader(data), loss_fn=gpt_loss)  # fmt: skip
    with pytest.raises(ConfigError, match="config._attn_implementation"):  # TinyGPT, no loss_fn
        VarpackTrainer(model, _args(data["tmp"] / "x"), plan_loader=_loader(data)).train()


@pytest.mark.slow
def test_trainer_and_accelerate_under_ddp_match_one_process(data: dict[str, Path]) -> None:
    out = data["tmp"] / "ddp"
    out.mkdir()
    ranks(2, ROOT / "tests" / "integrations" / "hf_ddp_worker.py", data["dp2"],  # as torchrun
          data["tokens"], out, timeout=300)  # fmt: skip
    got = torch.load(out / "ddp.pt", weights_only=False)
    assert got["world"] == 2 and got["accelerate_type"] == "DistributedDataParallel"
    model = tiny_gpt()
    steps = _loader(data, 2, rank=0).num_steps
    ref = reference(data["dp2"], data["tokens"], model, *train_py_recipe(model, steps), gpt_micro)
    assert list(got["trainer_losses"]) == list(range(1, steps + 1))
    np.testing.assert_allclose(list(got["trainer_losses"].values()), ref, rtol=RTOL)
    np.testing.assert_allclose(got["accelerate_losses"], ref, rtol=RTOL)
    _assert_weights(got["trainer_weights"], model.state_dict(), atol=1e-6)
    _assert_weights(got["accelerate_weights"], model.state_dict(), atol=1e-6)
