"""Feed varpack batches to a Hugging Face ``transformers`` causal LM, packed samples kept apart.

Restarting ``position_ids`` alone do not isolate packed samples in general: transformers 5.x
infers sample boundaries from them only when the model runs without a cache (``use_cache=False``)
and no mask is given, and even then rebuilds the mask every forward with a host sync. With the
default ``use_cache`` a Llama's logits differ from each sample run alone by about 0.5 (DESIGN.md).
:func:`hf_inputs` passes what each ``attn_implementation`` needs explicitly instead:

- ``sdpa``: a 4D boolean mask ``[B, 1, T, T]`` (True = attend), block-diagonal causal; transformers
  5.x hands a 4D mask to SDPA as it is;
- ``eager``: the same mask as an additive float ``[B, 1, T, T]`` (0 or the dtype's minimum):
  eager attention adds the mask to the scores, so a boolean one would be wrong;
- ``flex_attention``: a FlexAttention ``BlockMask`` (:func:`varpack.torch.masks.document_block_mask`),
  which transformers passes to ``flex_attention`` untouched;
- ``flash_attention_2`` / ``_3`` / hub kernels (any name with "flash"): no mask, and
  ``cu_seq_lens_q/k`` + ``max_length_q/k``, the padding-free varlen path (no unpadding, no sync).

A right-padded batch needs no mask with causal attention (real tokens never see the padding to
their right, and padding positions are ignored by the labels), except for FlexAttention, which
gets a causal ``BlockMask``. Blocks batches use their per-block masks, or ``cu_seq_lens`` over the
flattened view (transformers flattens ``[B, T]`` for the varlen kernel itself).

Every variant adds ``use_cache=False`` (training needs no KV cache). With ``labels=True`` it adds
``labels=batch.labels`` too: varpack's labels follow the Hugging Face convention (aligned with
``input_ids``, shifted inside the model's loss), and the first token of every sample is
``IGNORE_INDEX``, so no sample predicts its neighbour's first token in a packed row. Pass
``num_items_in_batch=batch.label_tokens`` (the supervised tokens of the whole global step, every
rank and micro-batch, from the plan) and ``out.loss`` is this micro-batch's share of the step's
token-mean loss: the sum of ``out.loss`` over a step's micro-batches and ranks equals the mean
token loss of its samples each run alone. DDP averages gradients over ranks, so backpropagate
``out.loss * world_size`` (what :func:`varpack.torch.loss.normalise` does for a custom model)::

    out = model(**hf_inputs(batch, attn, labels=True), num_items_in_batch=batch.label_tokens)
    (out.loss * world_size).backward()

Without ``num_items_in_batch`` transformers averages over each micro-batch's own tokens, which
weights a token of a short micro-batch more than one of a long one.

>>> hf_attention_kind("sdpa"), hf_attention_kind("kernels-community/flash-attn2")
('bool_mask', 'varlen')
"""

from __future__ import annotations

from typing import Any

import torch

from varpack.errors import ConfigError
from varpack.torch import masks
from varpack.torch.attention import batch_layout

KINDS = ("bool_mask", "float_mask", "block_mask", "varlen")
_BY_NAME = {"sdpa": "bool_mask", "eager": "float_mask", "flex_attention": "block_mask"}


def hf_attention_kind(attn_implementation: str) -> str:
    """What an ``attn_implementation`` needs to keep packed samples apart (one of :data:`KINDS`)."""
    if attn_implementation in _BY_NAME:
        return _BY_NAME[attn_implementation]
    if "flash" in attn_implementation.lower():
        return "varlen"
    raise ConfigError(
        f"attn_implementation={attn_implementation!r}: no packed-sample recipe for it; use sdpa, "
        f"eager, flex_attention or a flash implementation, or pass kind= one of {', '.join(KINDS)} "
        "for a custom attention function"
    )


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean "may attend" mask -> additive float mask: 0 where allowed, the dtype's minimum else.

    >>> additive_mask(torch.tensor([True, False]), torch.float32).tolist()
    [0.0, -3.4028234663852886e+38]
    """
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


def segment_attention(
    kind: str, segments: torch.Tensor | None, cu: torch.Tensor | None, longest: int,
    dtype: torch.dtype,
) -> dict[str, Any]:  # fmt: skip
    """What attention of ``kind`` needs to keep packed segments apart: ``varlen``, the
    ``cu_seq_lens`` (``cu``: cumulative segment starts) and ``longest``; ``block_mask``, a
    FlexAttention ``BlockMask`` of ``segments`` (``[B, T]`` segment ids); the masks, a causal
    block-diagonal mask of them, boolean or additive in ``dtype``."""
    if kind == "varlen":
        assert cu is not None
        cu32 = cu.to(torch.int32)
        return {"cu_seq_lens_q": cu32, "cu_seq_lens_k": cu32, "max_length_q": longest,
                "max_length_k": longest}  # fmt: skip
    assert segments is not None
    if kind == "block_mask":
        return {"attention_mask": masks.document_block_mask(segments)}
    allowed = masks.causal_mask_from_segments(segments)
    return {"attention_mask": allowed if kind == "bool_mask" else additive_mask(allowed, dtype)}


def hf_inputs(
    batch: Any,
    attn_implementation: str = "sdpa",
    *,
    dtype: torch.dtype = torch.float32,
    kind: str | None = None,
    max_seqlen: str = "batch",
    labels: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for ``model(**kwargs)`` of a ``transformers`` causal LM.

    ``attn_implementation``: the model's (``model.config._attn_implementation``); ``kind``
    overrides what it implies (for an attention function registered under another name).
    ``dtype``: the dtype of the additive mask for ``eager`` (the model's compute dtype).
    ``max_seqlen``: ``"batch"`` (the longest segment) or ``"row"`` (the row length: constant per
    shape, for a compiled model).
    ``labels``: add ``labels=batch.labels`` (then pass ``num_items_in_batch=batch.label_tokens``).
    """
    kind = kind or hf_attention_kind(attn_implementation)
    if kind not in KINDS:
        raise ConfigError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
    layout = batch_layout(batch)
    kwargs: dict[str, Any] = {
        "input_ids": batch.input_ids,
        "position_ids": batch.position_ids,
        "use_cache": False,
    }
    if labels:
        kwargs["labels"] = batch.labels
    if hasattr(batch, "model_inputs"):  # a VisionBatch: mRoPE positions, token types, pixels
        kwargs.update(batch.model_inputs())
    if kind == "varlen":
        if layout != "padded":  # one sample per row: the plain causal flash kernel is exact
            longest = (
                int(batch.input_ids.shape[1]) if max_seqlen == "row" else int(batch.max_seqlen)
            )
            kwargs.update(segment_attention(kind, None, batch.cu_seqlens, longest, dtype))
    elif kind == "block_mask" or layout != "padded":
        kwargs.update(segment_attention(kind, batch.segment_ids(), None, 0, dtype))
    return kwargs


__all__ = ["KINDS", "additive_mask", "hf_attention_kind", "hf_inputs", "segment_attention"]
