"""Qwen2-VL and Qwen2.5-VL samples packed into one row, each sample kept apart.

A vision-language sample, as the model's processor returns it, holds ``input_ids`` (its images'
placeholder tokens included), ``mm_token_type_ids`` (0 text, 1 image, 2 video),
``pixel_values`` with one row per patch and ``image_grid_thw`` (one ``(t, h, w)`` per image),
or the same for videos. :func:`pack_vlm` puts several of them into one packed row:

* the vision inputs are concatenated: the tower attends within each image (its ``grid_thw``
  says where one ends), so packing changes nothing there;
* ``position_ids`` are the ``[4, 1, T]`` that transformers 5 takes for packed Qwen2-VL input:
  row 0 the text positions (restarting at 0 with every sample), rows 1-3 the multimodal RoPE
  positions (temporal, height, width) of each sample alone (:func:`mrope_positions`, the
  model's ``get_rope_index`` without the model), so every sample sees the positions it has
  when it runs alone;
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

import numpy as np
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


def _vision_settings(model: Any) -> tuple[int, float | None]:
    """``(spatial_merge_size, tokens_per_second)`` of a Qwen2-VL / Qwen2.5-VL model or config
    (``tokens_per_second``: Qwen2.5-VL's, which spaces a video's temporal positions)."""
    config = getattr(model, "config", model)
    vision = getattr(config, "vision_config", None)
    if vision is None or not hasattr(vision, "spatial_merge_size"):
        raise InputError(
            f"{type(model).__name__} has no vision_config: pack_vlm packs Qwen2-VL and "
            "Qwen2.5-VL models (give the model or its config)"
        )
    tps = getattr(vision, "tokens_per_second", None)
    return int(vision.spatial_merge_size), None if tps is None else float(tps)


def mrope_positions(
    types: np.ndarray,
    image_grid: np.ndarray | None,
    video_grid: np.ndarray | None,
    merge: int,
    video_seconds: np.ndarray | None = None,
    tokens_per_second: float | None = None,
) -> np.ndarray:
    """``[3, L]`` multimodal RoPE positions (temporal, height, width) of one sample alone, as
    the model's ``get_rope_index`` gives them, without the model (so a DataLoader worker can
    compute them): text tokens count on from the last position on all three rows; an image's
    (or video's) placeholders take its merged grid's ``(t, h, w)`` indices from the current
    position, which then moves on by ``max(h, w) / merge``. ``types``: the sample's
    ``mm_token_type_ids`` (0 text, 1 image, 2 video); a video's temporal index is spaced by
    ``tokens_per_second x`` its seconds per grid step (Qwen2.5-VL; 1 for Qwen2-VL)."""
    types = np.asarray(types)
    out = np.empty((3, len(types)), dtype=np.int64)
    grids = {1: iter(np.asarray(image_grid if image_grid is not None else np.zeros((0, 3)))),
             2: iter(np.asarray(video_grid if video_grid is not None else np.zeros((0, 3))))}  # fmt: skip
    seconds = iter(np.asarray(video_seconds, dtype=np.float64) if video_seconds is not None
                   else np.ones(len(types)))  # fmt: skip
    edges = np.flatnonzero(np.diff(types)) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [len(types)]))
    pos = 0
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        kind = int(types[a])
        if kind == 0:
            out[:, a:b] = np.arange(b - a) + pos
            pos += b - a
            continue
        t, h, w = (int(v) for v in next(grids[kind]))
        gh, gw = h // merge, w // merge
        step = 1.0
        if kind == 2 and tokens_per_second is not None:
            step = tokens_per_second * float(next(seconds))
        temporal = (np.arange(t) * step).astype(np.int64) + pos
        tt, hh, ww = np.meshgrid(temporal, np.arange(gh) + pos, np.arange(gw) + pos, indexing="ij")
        out[:, a:b] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()])
        pos += max(h, w) // merge
    return out


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


def _positions(s: dict[str, Any], merge: int, tps: float | None) -> torch.Tensor:
    """``[4, 1, L]``: the text positions, then the sample's multimodal RoPE positions alone."""
    ids = s["input_ids"]
    n = ids.numel()
    text = np.arange(n, dtype=np.int64)[None]
    if "image_grid_thw" not in s and "video_grid_thw" not in s:
        return torch.from_numpy(np.repeat(text, 4, axis=0)).view(4, 1, n)
    seconds = s.get("second_per_grid_ts")
    mrope = mrope_positions(
        s["mm_token_type_ids"].cpu().numpy(),
        None if "image_grid_thw" not in s else s["image_grid_thw"].cpu().numpy(),
        None if "video_grid_thw" not in s else s["video_grid_thw"].cpu().numpy(),
        merge,
        None if seconds is None else torch.as_tensor(seconds).reshape(-1).cpu().numpy(),
        tps,
    )
    return torch.from_numpy(np.concatenate([text, mrope])).view(4, 1, n)


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
    Qwen2-VL / Qwen2.5-VL model, or its config (its vision config's ``spatial_merge_size`` and
    ``tokens_per_second`` are read: a DataLoader worker needs no model);
    ``dtype``: the additive mask's for ``eager``; ``labels``: add the packed labels."""
    if not samples:
        raise InputError("pack_vlm: no samples to pack")
    merge, tps = _vision_settings(model)
    kind = hf_attention_kind(attn_implementation)
    parts = [_checked(s, i, merge) for i, s in enumerate(samples)]
    ids = torch.cat([p["input_ids"] for p in parts]).view(1, -1)
    lens = torch.tensor([p["input_ids"].numel() for p in parts])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    out: dict[str, Any] = {
        "input_ids": ids,
        "mm_token_type_ids": torch.cat([p["mm_token_type_ids"] for p in parts]).view(1, -1),
        "position_ids": torch.cat([_positions(p, merge, tps) for p in parts], 2).to(ids.device),
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


__all__ = ["IGNORE_INDEX", "mrope_positions", "pack_vlm"]
