"""Qwen2-VL and Qwen2.5-VL samples packed into one row, each sample kept apart.

A vision-language sample, as the model's processor returns it, holds ``input_ids`` (its images'
placeholder tokens included), ``mm_token_type_ids`` (0 text, 1 image, 2 video),
``pixel_values`` with one row per patch and ``image_grid_thw`` (one ``(t, h, w)`` per image),
or the same for videos. :func:`pack_vlm` puts several of them into one packed row:

* the vision inputs are concatenated: the tower attends within each image (its ``grid_thw``
  says where one ends), so packing changes nothing there;
* ``position_ids`` are the ``[4, 1, T]`` that transformers 5 takes for packed Qwen2-VL input:
  row 0 the text positions (restarting at 0 with every sample), rows 1-3 the multimodal RoPE
  positions (temporal, height, width) of each sample alone, from the model's own
  ``get_rope_index``, so every sample sees the positions it has when it runs alone;
* attention is kept inside each sample as :func:`varpack.torch.hf.hf_inputs` keeps it (a
  block-diagonal causal mask for ``sdpa`` / ``eager``, a ``BlockMask`` for ``flex_attention``,
  ``cu_seq_lens`` for a flash kernel);
* ``labels`` (each sample's, or its ``input_ids``) are concatenated with every sample's first
  token set to ``IGNORE_INDEX``, so no sample predicts its neighbour's first token.

Each sample's logits are then those it has alone, and a step's loss and gradients those of the
samples run one by one (``tests/torch/test_vlm_pack.py``, a tiny random model of each family,
fp32). Pass ``num_items_in_batch`` (the step's supervised tokens) as for a text model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from varpack.errors import InputError
from varpack.torch import masks
from varpack.torch.batch import IGNORE_INDEX
from varpack.torch.hf import additive_mask, hf_attention_kind

_VISION = (("pixel_values", "image_grid_thw", 1), ("pixel_values_videos", "video_grid_thw", 2))


def _row(x: Any, name: str, i: int) -> torch.Tensor:
    """A sample's 1-D token tensor (``(L,)`` or ``(1, L)``)."""
    t = torch.as_tensor(x)
    if t.ndim == 2 and t.shape[0] == 1:
        t = t[0]
    if t.ndim != 1 or t.numel() == 0:
        raise InputError(
            f"sample {i}: {name} must hold one non-empty row, not shape {tuple(t.shape)}"
        )
    return t


def _rope_index(model: Any) -> Any:
    """The model's ``get_rope_index`` (on the model, or on its inner ``model``)."""
    for owner in (model, getattr(model, "model", None)):
        if owner is not None and hasattr(owner, "get_rope_index"):
            return owner.get_rope_index
    raise InputError(
        f"{type(model).__name__} has no get_rope_index: pack_vlm packs Qwen2-VL and Qwen2.5-VL "
        "models (Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration)"
    )


def _checked(sample: Mapping[str, Any], i: int, merge: int) -> dict[str, Any]:
    """One sample's tensors, checked against each other."""
    ids = _row(sample["input_ids"], "input_ids", i) if "input_ids" in sample else None
    if ids is None or "mm_token_type_ids" not in sample:
        raise InputError(f"sample {i}: give input_ids and mm_token_type_ids (the processor's)")
    types = _row(sample["mm_token_type_ids"], "mm_token_type_ids", i)
    if types.shape != ids.shape:
        raise InputError(f"sample {i}: mm_token_type_ids has {types.numel()} tokens, input_ids "
                         f"{ids.numel()}")  # fmt: skip
    out: dict[str, Any] = {"input_ids": ids, "mm_token_type_ids": types}
    for pixels, grid, code in _VISION:
        if (pixels in sample) != (grid in sample):
            raise InputError(f"sample {i}: give {pixels} and {grid} together")
        placeholders = int((types == code).sum())
        if grid not in sample:
            if placeholders:
                raise InputError(f"sample {i}: {placeholders} tokens of type {code} but no {grid}")
            continue
        g = torch.as_tensor(sample[grid]).reshape(-1, 3)
        rows = int(g.prod(-1).sum())
        if int(torch.as_tensor(sample[pixels]).shape[0]) != rows:
            raise InputError(f"sample {i}: {pixels} has {sample[pixels].shape[0]} rows, its "
                             f"{grid} {rows} patches")  # fmt: skip
        if placeholders * merge * merge != rows:
            raise InputError(f"sample {i}: {placeholders} placeholder tokens of type {code}, its "
                             f"{grid} {rows} patches make {rows // (merge * merge)}")  # fmt: skip
        out[pixels], out[grid] = sample[pixels], g
    labels = sample.get("labels")
    out["labels"] = ids if labels is None else _row(labels, "labels", i)
    if out["labels"].shape != ids.shape:
        raise InputError(f"sample {i}: labels has {out['labels'].numel()} tokens, input_ids "
                         f"{ids.numel()}")  # fmt: skip
    if "second_per_grid_ts" in sample:
        out["second_per_grid_ts"] = sample["second_per_grid_ts"]
    return out


def _positions(s: dict[str, Any], rope: Any) -> torch.Tensor:
    """``[4, 1, L]``: the text positions, then the sample's multimodal RoPE positions alone."""
    ids = s["input_ids"]
    n = ids.numel()
    text = torch.arange(n, device=ids.device).view(1, 1, n)
    if "image_grid_thw" not in s and "video_grid_thw" not in s:
        return text.expand(4, 1, n)
    extra = {"second_per_grid_ts": s["second_per_grid_ts"]} if "second_per_grid_ts" in s else {}
    mrope, _ = rope(ids.view(1, n), mm_token_type_ids=s["mm_token_type_ids"].view(1, n),
                    image_grid_thw=s.get("image_grid_thw"), video_grid_thw=s.get("video_grid_thw"),
                    **extra)  # fmt: skip
    return torch.cat([text, mrope.to(ids.dtype)], 0)


def pack_vlm(
    samples: Sequence[Mapping[str, Any]],
    model: Any,
    attn_implementation: str = "sdpa",
    *,
    dtype: torch.dtype = torch.float32,
    labels: bool = True,
) -> dict[str, Any]:
    """Keyword arguments for ``model(**kwargs)``: ``samples`` (each a processor's output for one
    sample) packed into one row, each kept apart (see the module doc). ``model``: the
    Qwen2-VL / Qwen2.5-VL model (its ``get_rope_index`` and ``spatial_merge_size`` are read);
    ``dtype``: the additive mask's for ``eager``; ``labels``: add the packed labels."""
    if not samples:
        raise InputError("pack_vlm: no samples to pack")
    rope = _rope_index(model)
    vision = getattr(getattr(model, "config", None), "vision_config", None)
    merge = int(getattr(vision, "spatial_merge_size", 2))
    kind = hf_attention_kind(attn_implementation)
    parts = [_checked(s, i, merge) for i, s in enumerate(samples)]
    ids = torch.cat([p["input_ids"] for p in parts]).view(1, -1)
    lens = torch.tensor([p["input_ids"].numel() for p in parts])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    out: dict[str, Any] = {
        "input_ids": ids,
        "mm_token_type_ids": torch.cat([p["mm_token_type_ids"] for p in parts]).view(1, -1),
        "position_ids": torch.cat([_positions(p, rope) for p in parts], 2),
        "use_cache": False,
    }
    for pixels, grid, _ in _VISION:
        held = [p for p in parts if grid in p]
        if held:
            out[pixels] = torch.cat([torch.as_tensor(p[pixels]) for p in held], 0)
            out[grid] = torch.cat([p[grid] for p in held], 0)
    seconds = [p["second_per_grid_ts"] for p in parts if "second_per_grid_ts" in p]
    if seconds:
        out["second_per_grid_ts"] = torch.cat([torch.as_tensor(x).reshape(-1) for x in seconds])
    if labels:
        packed = torch.cat([p["labels"] for p in parts]).clone()
        packed[cu[:-1]] = IGNORE_INDEX  # no sample predicts its neighbour's first token
        out["labels"] = packed.view(1, -1)
    segments = masks.segment_ids(cu.to(ids.device), ids.shape[1]).view(1, -1)
    if kind == "varlen":
        longest = int(lens.max())
        out.update(cu_seq_lens_q=cu.to(torch.int32), cu_seq_lens_k=cu.to(torch.int32),
                   max_length_q=longest, max_length_k=longest)  # fmt: skip
    elif kind == "block_mask":
        out["attention_mask"] = masks.document_block_mask(segments)
    else:
        allowed = masks.causal_mask_from_segments(segments)
        out["attention_mask"] = allowed if kind == "bool_mask" else additive_mask(allowed, dtype)
    return out


__all__ = ["IGNORE_INDEX", "pack_vlm"]
