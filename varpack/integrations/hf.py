"""``VarpackTrainer``: ``transformers.Trainer`` replaying a varpack plan, exactly.

What the plan decides, the Trainer must not decide again. :class:`VarpackTrainerMixin` (with
:class:`VarpackTrainer` = mixin + ``Trainer``) overrides these pieces (transformers 5.x):

- data: ``get_train_dataloader`` returns the :class:`~varpack.torch.loader.PlanLoader`'s
  micro-batches of this rank, not an ``accelerate``-prepared DataLoader (no sharding, no
  dispatch: each DDP rank reads its own rank of the plan);
- gradient accumulation: ``gradient_accumulation_steps`` is the plan's micro-batches per step
  (every step of the rank must hold exactly that many; one error line otherwise), so Trainer
  synchronises DDP gradients and steps the optimizer exactly at ``batch.is_last_micro``;
- processes: :func:`~varpack.integrations.world.settle_world` makes the Trainer's world the
  launcher's (on the CPU by ``use_cpu=True``, else one line), and the loader's rank must be the
  Trainer's (:func:`~varpack.integrations.world.check_world`);
- synchronisation: a plan balanced for ranks that meet once per step (``--sync step``) under
  FSDP or DeepSpeed ZeRO-3 (they meet at every micro-batch) is one warning on rank 0 when the
  Trainer is built (:func:`~varpack.integrations.sync.check_sync`), held to what runs: on the
  CPU ``fsdp=...`` trains DDP, and a warning says so;
- vocabulary: this rank's token ids are checked against the model's vocabulary before anything
  is built (:func:`~varpack.torch.vocab.check_vocab`, as ``jobs/train.py`` does);
- steps: ``max_steps`` is the plan's steps (a smaller one stops early);
- loss: ``get_batch_samples`` takes ``num_items_in_batch`` from the plan
  (``batch.label_tokens``, no all-gather) and ``compute_loss`` returns
  :func:`~varpack.integrations.loss.plan_loss`: the micro-batch's summed token loss over the
  step's supervised tokens, times the world size. That is what Trainer's own ``compute_loss``
  returns for a model given the global ``num_items_in_batch`` with
  ``average_tokens_across_devices`` (``loss *= num_processes``), and ``loss_is_scaled_for_ga``
  stops ``training_step`` dividing it by the accumulation steps again. The logged ``loss`` (with
  ``logging_steps=1``) is then each step's exact token-mean loss over all ranks;
- LR: ``create_scheduler`` wraps Trainer's schedule (``lr_scheduler_type`` over ``max_steps``,
  as in any Trainer run, or the scheduler passed in ``optimizers=``) in
  :class:`~varpack.torch.lr.VariableBatchSizeLR` with the plan's LR factor of each step (indexed
  by the global step, which is the plan's step). A run resumed with another ``max_steps``
  follows the new schedule from its first step;
- epoch: ``state.epoch`` after each step is the plan's steps done over its steps
  (:class:`PlanEpoch`), so a resumed run goes on counting where the checkpoint stood (Trainer
  counts the micro-batches of its own ``train`` call, from 0 again);
- checkpoints: ``_save_checkpoint`` writes the loader's cursor to ``checkpoint-N/``
  :data:`LOADER_STATE`, ``train(resume_from_checkpoint=...)`` restores it, and
  ``ignore_data_skip`` is forced on (the cursor already stands at the next micro-batch; Trainer's
  own skipping would skip again). Model, optimizer, scheduler and RNG are Trainer's as usual.

For models that are not ``transformers`` models, give ``loss_fn(model, batch)`` returning the
micro-batch's summed token loss; its weights are saved as a plain state dict (tied tensors
stored as copies, which safetensors requires).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from varpack.errors import ConfigError, InputError
from varpack.integrations.loss import LossFn, plan_loss, unwrapped
from varpack.integrations.sync import asked, check_sync
from varpack.integrations.world import check_world, settle_world
from varpack.torch.job import all_or_none
from varpack.torch.loader import PlanLoader
from varpack.torch.lr import VariableBatchSizeLR
from varpack.torch.vocab import check_vocab

#: the loader cursor's file in each ``checkpoint-N/`` directory
LOADER_STATE = "varpack_loader.json"
#: the key of the varpack batch in the inputs dict Trainer passes to ``compute_loss``
BATCH_KEY = "varpack_batch"

_Base: Any = Trainer if TYPE_CHECKING else object


def configure_args(args: Any, loader: PlanLoader) -> None:
    """Set the ``TrainingArguments`` the plan decides (in place), refusing contradictions; the
    Trainer's processes are the launcher's and the loader's (:mod:`varpack.integrations.world`)."""
    settle_world(args)
    check_world(args, loader)
    ga = loader.grad_accum
    counts = np.bincount(loader.rows.step, minlength=loader.plan.num_steps)
    if len(counts) and (counts.min() != ga or counts.max() != ga):
        raise InputError(
            f"{loader.path}: rank {loader.rank}'s steps hold {counts.min()}..{counts.max()} "
            f"micro-batches, but Trainer accumulates a fixed number per step (the plan's "
            f"grad-accum {ga}); train this plan with a loop of your own (README, 'A trainer loop')"
        )
    if args.gradient_accumulation_steps not in (1, ga):
        raise ConfigError(
            f"gradient_accumulation_steps={args.gradient_accumulation_steps}, but the plan "
            f"accumulates {ga} micro-batches per step: leave it out (the plan sets it)"
        )
    if args.max_steps > loader.num_steps:
        raise ConfigError(
            f"max_steps={args.max_steps}: the plan has {loader.num_steps} steps; leave it out "
            "(the plan's steps) or give fewer to stop early"
        )
    if loader.cp_size > 1:
        raise ConfigError("a --cp plan needs varpack.torch.cp inputs; Trainer is not supported")
    args.gradient_accumulation_steps = ga
    if args.max_steps <= 0:
        args.max_steps = loader.num_steps
    args.ignore_data_skip = True


def model_vocab(model: nn.Module | None) -> tuple[int, str] | None:
    """The token ids ``model`` takes (``0 .. n-1``) and where that number is set; ``None`` when
    the model does not say. A ``transformers`` model: the smaller of its input embedding's rows
    and its output head's width (labels index the logits); else ``config.vocab_size`` or
    ``cfg.vocab_size``."""
    if model is None:
        return None
    inner = unwrapped(model)
    sizes = []
    for get in ("get_input_embeddings", "get_output_embeddings"):
        try:
            layer = getattr(inner, get)() if callable(getattr(inner, get, None)) else None
        except NotImplementedError:  # a PreTrainedModel without such a layer
            layer = None
        if isinstance(layer, nn.Embedding):
            sizes.append(layer.num_embeddings)
        elif isinstance(layer, nn.Linear):
            sizes.append(layer.out_features)
    if sizes:
        how = "the model's vocabulary (config.vocab_size; model.resize_token_embeddings)"
        return min(sizes), how
    for holder in ("config", "cfg"):
        size = getattr(getattr(inner, holder, None), "vocab_size", None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size, f"model.{holder}.vocab_size"
    return None


def check_model_vocab(model: nn.Module | None, loader: PlanLoader, vocab_size: int | None) -> None:
    """This rank's token ids against the model's vocabulary (``vocab_size``, else
    :func:`model_vocab`): one line before anything is built, not an ``IndexError`` (a
    device-side assert on CUDA) in the embedding. Nothing is checked when neither says."""
    found = (vocab_size, "vocab_size=") if vocab_size is not None else model_vocab(model)
    if found is not None:
        check_vocab(loader, found[0], found[1])


class PlanBatches:
    """What ``get_train_dataloader`` returns: the loader's micro-batches as they come (``len``:
    micro-batches of one pass, which Trainer turns into the plan's steps)."""

    def __init__(self, loader: PlanLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


def read_loader_state(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """The loader cursor saved in a Trainer checkpoint directory (one error line if absent)."""
    path = os.path.join(checkpoint, LOADER_STATE)
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except FileNotFoundError:
        raise InputError(
            f"{checkpoint}: no {LOADER_STATE}, so where the plan stands is unknown; resume "
            "from a checkpoint that a VarpackTrainer saved"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the loader state ({exc})") from None
    if not isinstance(state, dict):
        raise InputError(f"{path}: the loader state is damaged (not a JSON object)")
    return state


def write_loader_state(directory: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write :data:`LOADER_STATE` into ``directory`` atomically (temporary sibling, rename)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOADER_STATE)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


def untied(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict whose tensors share no storage (later sharers copied), as safetensors needs.

    >>> w = torch.zeros(2)
    >>> sd = untied({"a": w, "b": w})
    >>> sd["a"] is w, sd["b"] is w, torch.equal(sd["a"], sd["b"])
    (True, False, True)
    """
    seen: set[int] = set()
    out = {}
    for name, t in state_dict.items():
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.detach().clone() if ptr in seen else t
        seen.add(ptr)
    return out


class PlanEpoch(TrainerCallback):  # type: ignore[misc]
    """``state.epoch`` after each optimizer step: the plan's steps done over its steps (what
    Trainer counts in an uninterrupted run, micro-batches over a pass). Trainer counts the
    micro-batches of the current ``train`` call only, so after a resume it started again at 0."""

    def __init__(self, steps: int) -> None:
        self.steps = max(int(steps), 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        state.epoch = state.global_step / self.steps


class VarpackTrainerMixin(_Base):
    """Put before a ``transformers.Trainer`` subclass: ``class T(VarpackTrainerMixin, SFTTrainer)``.

    ``plan_loader``: this rank's :class:`PlanLoader` (under torchrun, made without ``rank=``).
    ``loss_fn``: for a module that is not a ``transformers`` model, ``(model, batch) -> summed
    token loss``. ``attn_implementation``: overrides ``model.config._attn_implementation`` for
    :func:`~varpack.torch.hf.hf_inputs`. ``vocab_size``: the token ids the model takes, for a
    model that does not say (:func:`model_vocab`). ``args`` (``TrainingArguments``) is required
    and set in place (:func:`configure_args`). A refusal on one rank is raised on every rank
    (:func:`~varpack.torch.job.all_or_none`), so no rank waits for another in a collective.
    """

    #: compute_loss already normalises over the whole step: training_step must not divide by GA
    loss_is_scaled_for_ga: bool | None = True
    lr_scheduler: Any  # Trainer's; here a VariableBatchSizeLR once created

    def __init__(
        self,
        model: Any = None,
        args: Any = None,
        *more: Any,
        plan_loader: PlanLoader,
        loss_fn: LossFn | None = None,
        attn_implementation: str | None = None,
        vocab_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        if args is None:
            raise ConfigError("give args= (TrainingArguments): the plan sets some of them")
        settle_world(args)  # the same on every rank; from here on the ranks agree on errors

        def check() -> None:
            configure_args(args, plan_loader)
            check_model_vocab(model, plan_loader, vocab_size)

        all_or_none(check)
        self.plan_loader = plan_loader
        self.loss_fn = loss_fn
        self.attn_implementation = attn_implementation
        super().__init__(model, args, *more, **kwargs)
        # first: every other callback (and the log line) sees the step's epoch of the plan
        self.callback_handler.callbacks.insert(0, PlanEpoch(plan_loader.num_steps))
        # the plugins are known by now; FSDP asked for and not run (the CPU) is said too
        check_sync(self.accelerator, plan_loader, self.model, asked(args))

    # -- data ------------------------------------------------------------------------------
    def get_train_dataloader(self) -> Any:
        return PlanBatches(self.plan_loader)

    def get_batch_samples(
        self, epoch_iterator: Iterator[Any], num_batches: int, device: Any
    ) -> tuple[list[Any], Any]:
        """The next step's micro-batches (checked to be one whole step, the one Trainer is at)
        and its supervised tokens from the plan as ``num_items_in_batch``."""
        samples: list[dict[str, Any]] = []
        for _ in range(num_batches):
            try:
                batch = next(epoch_iterator)
            except StopIteration:
                break
            batch = batch.to(device, non_blocking=True)
            samples.append({"input_ids": batch.input_ids, BATCH_KEY: batch})
        if not samples:
            return samples, None
        batches = [s[BATCH_KEY] for s in samples]
        step = self.state.global_step
        if (
            len(batches) != num_batches
            or any(b.step != step for b in batches)
            or [b.micro for b in batches] != list(range(num_batches))
            or not batches[-1].is_last_micro
        ):
            got = ", ".join(f"{b.step}/{b.micro}" for b in batches)
            raise InputError(
                f"Trainer is at step {step} with {num_batches} micro-batches per step, but the "
                f"plan's next micro-batches are (step/micro) {got}: the loader and the Trainer "
                "state disagree; resume with train(resume_from_checkpoint=...) of a "
                "VarpackTrainer checkpoint and a fresh PlanLoader"
            )
        return samples, batches[0].label_tokens

    # -- loss ------------------------------------------------------------------------------
    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        batch = inputs.get(BATCH_KEY)
        if batch is None:  # evaluation on an ordinary dataset
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        if model.training and batch.is_last_micro != self.accelerator.sync_gradients:
            raise InputError(
                f"step {batch.step} micro {batch.micro}: Trainer's gradient sync does not "
                "follow the plan's last micro-batch of the step"
            )
        loss = plan_loss(
            model, batch, self.plan_loader.world_size, self.loss_fn, self.attn_implementation
        )
        return (loss, None) if return_outputs else loss

    # -- LR --------------------------------------------------------------------------------
    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """Trainer's schedule over ``num_training_steps`` (``max_steps``: the plan's steps unless
        fewer were given), or the one given in ``optimizers=``, times the plan's LR factor of each
        step. Resumed, the base schedule is Trainer's new one (another ``max_steps`` gives
        another curve) and :class:`VariableBatchSizeLR` takes its LR at the restored step."""
        if isinstance(self.lr_scheduler, VariableBatchSizeLR):
            return self.lr_scheduler
        base = super().create_scheduler(num_training_steps, optimizer)
        if isinstance(base, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ConfigError(
                "ReduceLROnPlateau has no per-step schedule for the plan's LR factors"
            )
        self.lr_scheduler = VariableBatchSizeLR(base, self.plan_loader.lr_factors())
        return self.lr_scheduler

    # -- checkpoints -----------------------------------------------------------------------
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> Any:
        """Trainer's ``train``; resuming also puts the plan loader where the checkpoint stood."""
        checkpoint: Any = resume_from_checkpoint
        if checkpoint is True:  # the last one, as Trainer finds it (Trainer says if none)
            checkpoint = get_last_checkpoint(self.args.output_dir) or True
        if isinstance(checkpoint, (str, os.PathLike)):
            checkpoint = os.fspath(checkpoint)
            self.plan_loader.load_state_dict(read_loader_state(checkpoint))
        return super().train(
            resume_from_checkpoint=checkpoint,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
        )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Trainer's checkpoint, plus the loader's cursor (written first, by the saving rank)."""
        state = self.plan_loader.state_dict()
        if state["step"] != self.state.global_step:
            raise InputError(
                f"saving at step {self.state.global_step}, but the plan loader stands at step "
                f"{state['step']} micro {state['micro']}"
            )
        if self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            write_loader_state(os.path.join(self._get_output_dir(trial=trial), folder), state)
        super()._save_checkpoint(model, trial)

    def _save(
        self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None
    ) -> None:
        inner = unwrapped(self.model)
        if state_dict is None and not hasattr(inner, "save_pretrained"):
            state_dict = untied(inner.state_dict())  # a plain module: safetensors file
        super()._save(output_dir, state_dict)


class VarpackTrainer(VarpackTrainerMixin, Trainer):
    """``transformers.Trainer`` on a varpack plan::

    trainer = VarpackTrainer(model, TrainingArguments("run/"), plan_loader=loader)
    trainer.train()                              # or train(resume_from_checkpoint=True)
    """


__all__ = [
    "BATCH_KEY",
    "LOADER_STATE",
    "PlanBatches",
    "PlanEpoch",
    "VarpackTrainer",
    "VarpackTrainerMixin",
    "check_model_vocab",
    "configure_args",
    "model_vocab",
    "read_loader_state",
]
