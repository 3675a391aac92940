"""The runtime reader: replay a varpack plan inside a torch trainer.

The only part of varpack that imports torch. The pieces:

- :class:`PlanLoader` (``loader``): this rank's micro-batches, in plan order, resumable.
- :class:`PackedBatch`, :class:`PaddedBatch`, :class:`BlockBatch` (``batch``): what it yields.
- :class:`ParquetTokenDataset` (``dataset``): tokens by sample id from tokenized Parquet.
- :class:`VariableBatchSizeLR` (``lr``): the plan's per-step LR factor on top of any scheduler.
- :func:`normalise`, :func:`token_loss_sum` (``loss``): exact loss normalisation per global step.
- :func:`compile_warmup` (``warmup``): one forward/backward per shape before training.
- ``masks``: block-diagonal causal masks from ``cu_seqlens``; ``model``: a small reference GPT.
"""

from varpack.torch.batch import IGNORE_INDEX, BlockBatch, PackedBatch, PaddedBatch
from varpack.torch.dataset import ParquetTokenDataset
from varpack.torch.loader import PlanLoader, load_lr_factors
from varpack.torch.loss import normalise, token_loss_sum, token_losses
from varpack.torch.lr import VariableBatchSizeLR
from varpack.torch.warmup import compile_warmup, dummy_batch, rank_shapes

__all__ = [
    "IGNORE_INDEX",
    "BlockBatch",
    "PackedBatch",
    "PaddedBatch",
    "ParquetTokenDataset",
    "PlanLoader",
    "VariableBatchSizeLR",
    "compile_warmup",
    "dummy_batch",
    "load_lr_factors",
    "normalise",
    "rank_shapes",
    "token_loss_sum",
    "token_losses",
]
