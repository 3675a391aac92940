"""The runtime reader: replay a varpack plan inside a torch trainer.

The only part of varpack that imports torch. The pieces:

- :class:`PlanLoader` (``loader``): this rank's micro-batches, in plan order, resumable.
- :class:`PackedBatch`, :class:`PaddedBatch`, :class:`BlockBatch` (``batch``): what it yields;
  :class:`VisionBatch` (``vlm``) with ``vision=``, for Qwen2-VL / Qwen2.5-VL samples.
- :class:`ParquetTokenDataset` (``dataset``): tokens by sample id from tokenized Parquet.
- :class:`VariableBatchSizeLR` (``lr``): the plan's per-step LR factor on top of any scheduler.
- :func:`normalise`, :func:`token_loss_sum` (``loss``): exact loss normalisation per global step.
- :func:`check_vocab` (``vocab``): the plan's token ids against a model's vocabulary, up front.
- :func:`sample_losses`, :func:`group_losses` (``grouped``): loss per sample and per value of a
  carried column (``batch.carry``, from ``varpack plan --carry``), e.g. per source.
- :func:`compile_warmup` (``warmup``): one forward/backward per shape before training.
- :func:`packed_attention`, :func:`attention_meta` (``attention``): attention that keeps packed
  samples apart (varlen kernels, FlexAttention, SDPA), inputs built once per batch.
- ``rollout``: an RL rollout batch (padded tensors as verl holds them, or a list of token
  tensors) cut into a :class:`varpack.online.BatchPlan`'s micro-batches, outputs put back.
- ``masks``: block-diagonal masks and FlexAttention block masks; ``model``: a small reference GPT;
  ``hf``: :func:`~varpack.torch.hf.hf_inputs` for Hugging Face ``transformers`` models;
  ``vlm``: :func:`~varpack.torch.vlm.pack_vlm`, Qwen2-VL / Qwen2.5-VL samples (the processor's
  outputs) packed into one row with their multimodal RoPE positions, each kept apart.
- ``launch``: rank, world size and local rank from torchrun or Slurm (``srun``), and the
  rendezvous address under Slurm; ``job``: what ``jobs/train.py`` shares with any trainer (errors
  agreed by all ranks, interruption at a step boundary, ``metrics.jsonl``, the exit);
  ``torchrun``: ``python -m varpack.torch.torchrun``, torchrun that reports a failure in one line.
"""

from varpack.torch.attention import AttentionMeta, attention_meta, packed_attention, resolve_backend
from varpack.torch.batch import IGNORE_INDEX, BlockBatch, PackedBatch, PaddedBatch
from varpack.torch.dataset import ParquetTokenDataset
from varpack.torch.grouped import GroupTally, group_losses, sample_losses
from varpack.torch.loader import PlanLoader, load_lr_factors
from varpack.torch.loss import normalise, token_loss_sum, token_losses
from varpack.torch.lr import VariableBatchSizeLR
from varpack.torch.vlm import VisionBatch, pack_vlm
from varpack.torch.vocab import check_vocab
from varpack.torch.warmup import compile_warmup, compiled_graphs, dummy_batch, rank_shapes

__all__ = [
    "IGNORE_INDEX",
    "AttentionMeta",
    "BlockBatch",
    "PackedBatch",
    "PaddedBatch",
    "ParquetTokenDataset",
    "PlanLoader",
    "VariableBatchSizeLR",
    "VisionBatch",
    "attention_meta",
    "check_vocab",
    "compile_warmup",
    "compiled_graphs",
    "dummy_batch",
    "GroupTally",
    "group_losses",
    "load_lr_factors",
    "normalise",
    "pack_vlm",
    "packed_attention",
    "rank_shapes",
    "resolve_backend",
    "sample_losses",
    "token_loss_sum",
    "token_losses",
]
