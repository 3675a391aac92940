"""Shared by the tests of ``varpack.integrations`` and their torchrun workers: the data and
plans, the reference recipe and reference loop, the README's Trainer arguments and Llama.

The recipe is ``jobs/train.py``'s: TinyGPT (``tiny`` preset) seeded with ``torch.manual_seed``,
``AdamW(lr, weight_decay=0, foreach=False)``, ``LambdaLR(lr_lambda(warmup, steps))`` (train.py's
own ``lr_lambda``) under :class:`VariableBatchSizeLR`, gradient clipping at 1.0, and the summed
token loss of ``token_losses`` over ``model_inputs(batch, "auto", max_seqlen="batch")``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from varpack.torch import (
    ParquetTokenDataset,
    PlanLoader,
    VariableBatchSizeLR,
    normalise,
    token_loss_sum,
)
from varpack.torch.model import PRESETS, TinyGPT, model_inputs

ROOT = Path(__file__).resolve().parents[2]
LR, WARMUP, SEED = 3e-4, 2, 0
sys.path.insert(0, str(ROOT / "tests" / "torch"))  # plan_helpers (workers run outside pytest)


def make_plans(tmp: Path) -> dict[str, Path]:
    """Tokens (ids 1..255) and two real plans (``varpack plan``): dp 1 and dp 2, grad-accum 2,
    shuffled, an LR factor per step (its tokens / 160)."""
    from plan_helpers import random_lengths, write_tokens
    from testkit import cli, write_metadata

    lens = random_lengths(np.random.default_rng(5), 48, 2, 40)
    write_tokens(tmp / "tok.parquet", list(lens), list(lens.values()))
    write_metadata(tmp / "meta" / "m.parquet", list(lens), list(lens.values()))
    out = {"tmp": tmp, "tokens": tmp / "tok.parquet"}
    for dp in (1, 2):
        out[f"dp{dp}"] = tmp / f"plan-dp{dp}"
        cli("plan", tmp / "meta", out[f"dp{dp}"], "--dp", dp, "--grad-accum", 2,
            "--max-tokens", 96, "--pad-multiple", 16, "--order", "shuffle", "--seed", 3,
            "--lr-scaling", "linear", "--base-unit", "tokens", "--base-batch-size", 160,
            "-q")  # fmt: skip
    return out


def readme_args(out: Path, **kw: Any) -> Any:
    """The README's ``TrainingArguments`` ("Train with Hugging Face Trainer"), nothing added."""
    from transformers import TrainingArguments

    base = dict(learning_rate=1e-3, lr_scheduler_type="cosine", logging_steps=1, save_steps=2,
                report_to="none", disable_tqdm=True)  # fmt: skip
    return TrainingArguments(str(out), **{**base, **kw})


def readme_llama(vocab_size: int = 512, seed: int = 1) -> Any:
    """The README's Llama (sdpa), seeded."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=4096, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def train_py() -> Any:
    """``jobs/train.py`` as a module (``jobs/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("varpack_jobs_train", ROOT / "jobs" / "train.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_gpt(seed: int = SEED) -> TinyGPT:
    torch.manual_seed(seed)  # train.py: manual_seed(--seed), then the model
    return TinyGPT(PRESETS["tiny"])


def gpt_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """train.py's summed token loss of a micro-batch (its ``micro_loss`` before ``normalise``)."""
    logits = model(**model_inputs(batch, "auto", torch.float32, max_seqlen="batch"))
    return token_loss_sum(logits, batch.labels)


def train_py_recipe(model: nn.Module, num_steps: int) -> tuple[Any, Any]:
    """train.py's optimizer and base schedule (before the plan's LR factors)."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, foreach=False)
    base = torch.optim.lr_scheduler.LambdaLR(opt, train_py().lr_lambda(WARMUP, num_steps))
    return opt, base


def by_step(loader: PlanLoader) -> Iterator[list[Any]]:
    """The loader's micro-batches, one list per optimizer step."""
    step: list[Any] = []
    for batch in loader:
        step.append(batch)
        if batch.is_last_micro:
            yield step
            step = []


def reference(
    plan: Path,
    tokens: Path,
    model: nn.Module,
    opt: Any,
    base: Any,
    micro_loss: Callable[[nn.Module, Any], torch.Tensor],
    clip: float | None = 1.0,
) -> list[float]:
    """Train on every rank of ``plan`` in this one process; each step's loss, in step order.

    ``micro_loss(model, batch)``: the micro-batch's loss over the step's supervised tokens
    (world size 1). Summed over every rank's micro-batches of a step, its gradients are exactly
    what DDP's average of the ranks' ``* world`` losses gives, up to float rounding.
    """
    dataset = ParquetTokenDataset(tokens)
    dp = PlanLoader(plan, dataset, rank=0).plan.dp
    loaders = [PlanLoader(plan, dataset, rank=r) for r in range(dp)]
    sched = VariableBatchSizeLR(base, loaders[0].lr_factors())
    losses = []
    for ranks in zip(*(by_step(loader) for loader in loaders), strict=True):
        total = 0.0
        for batch in (b for rank in ranks for b in rank):
            loss = micro_loss(model, batch)
            loss.backward()
            total += float(loss.detach())
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


def gpt_micro(model: nn.Module, batch: Any) -> torch.Tensor:
    """train.py's micro-batch loss at world size 1."""
    return normalise(gpt_loss(model, batch), batch, 1)


def trainer_losses(trainer: Any) -> dict[int, float]:
    """Trainer's logged loss of every step (``logging_steps=1``), by step number (1-based)."""
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
