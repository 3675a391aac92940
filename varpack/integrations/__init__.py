"""Training frameworks driving a varpack plan: Hugging Face ``transformers.Trainer`` and ``accelerate``.

The plan decides every micro-batch, step, LR factor and loss normaliser; these modules hand those
decisions to a framework's training loop without letting it re-batch, re-shard or re-scale:

- ``hf``: :class:`~varpack.integrations.hf.VarpackTrainer`, a ``transformers.Trainer`` whose
  data, gradient accumulation, loss scaling, LR schedule and checkpoints follow the plan, and
  :class:`~varpack.integrations.hf.VarpackTrainerMixin` for other ``Trainer`` subclasses (TRL's
  ``SFTTrainer``);
- ``accelerate``: :func:`~varpack.integrations.accelerate.micro_step` for a plain ``accelerate``
  loop (``accelerator.prepare(model, optimizer)`` only, never the loader);
- ``loss``: :func:`~varpack.integrations.loss.plan_loss`, the micro-batch loss both use;
- ``sync``: :func:`~varpack.integrations.sync.check_sync`, the trainer's synchronisation (FSDP,
  DeepSpeed's ZeRO stage, DDP, from ``accelerate``'s state) held to the plan's ``--sync``;
- ``world``: :func:`~varpack.integrations.world.settle_world`, the Trainer's processes made the
  launcher's (one model over every process, or one line).

Like ``varpack.torch``, which it builds on (and the metadata and planfile rooms), this package
imports torch, and ``transformers`` / ``accelerate`` too (the ``hf`` extra); nothing else in
varpack imports it. See docs/hf.md.
"""
