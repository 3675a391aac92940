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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from varpack.errors import InputError
from varpack.torch.batch import IGNORE_INDEX, PackedBatch
from varpack.torch.collate import RowInfo, check_lengths, info_tensors, pack_packed, row_info
from varpack.torch.hf import hf_attention_kind, hf_inputs

_VISION = (("pixel_values", "image_grid_thw", 1), ("pixel_values_videos", "video_grid_thw", 2))


def _tensor(x: Any, name: str, where: str) -> torch.Tensor:
    """``x`` as a tensor (a tensor, an array or a list), or one line saying what it is."""
    try:
        return torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"{where}: {name} must be a tensor, an array or a list of numbers, "
                         f"not {type(x).__name__}") from None  # fmt: skip


def _integers(t: torch.Tensor, name: str, where: str) -> torch.Tensor:
    """``t`` as int64, refused where it is not integers (floats, booleans)."""
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise InputError(f"{where}: {name} has dtype {t.dtype}; give integers")
    return t.to(torch.int64)


def _row(x: Any, name: str, where: str) -> torch.Tensor:
    """A sample's 1-D token tensor (``(L,)`` or ``(1, L)``), int64."""
    t = _tensor(x, name, where)
    if t.ndim == 2 and t.shape[0] == 1:
        t = t[0]
    if t.ndim != 1 or t.numel() == 0:
        raise InputError(f"{where}: {name} must hold one non-empty row, not shape {tuple(t.shape)}")
    return _integers(t, name, where)


def _grids(x: Any, name: str, where: str, merge: int) -> np.ndarray:
    """A sample's grids ``(k, 3)`` int64 (one ``[t, h, w]`` as ``(3,)`` too), each >= 1 with
    ``h`` and ``w`` multiples of ``merge`` (the merger folds ``merge x merge`` patches)."""
    g = _integers(_tensor(x, name, where), name, where).cpu().numpy()
    if g.ndim == 1 and g.size == 3:
        g = g.reshape(1, 3)
    if g.ndim != 2 or g.shape[1] != 3:
        raise InputError(f"{where}: {name} must be one [t, h, w] per image, shape (k, 3), not "
                         f"{tuple(g.shape)}")  # fmt: skip
    bad = np.flatnonzero((g < 1).any(axis=1) | (g[:, 1:] % merge != 0).any(axis=1))
    if len(bad):
        raise InputError(f"{where}: {name}[{int(bad[0])}] is {g[bad[0]].tolist()}; each of t, h, "
                         f"w must be >= 1, h and w multiples of the merge size {merge}")  # fmt: skip
    return g


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
    where: str = "sample",
) -> np.ndarray:
    """``[3, L]`` multimodal RoPE positions (temporal, height, width) of one sample alone, as
    the model's ``get_rope_index`` gives them, without the model (so a DataLoader worker can
    compute them): text tokens count on from the last position on all three rows; an image's
    (or video's) placeholders take its merged grid's ``(t, h, w)`` indices from the current
    position, which then moves on by ``max(h, w) / merge``. ``types``: the sample's
    ``mm_token_type_ids`` (0 text, 1 image, 2 video); a video's temporal index is spaced by
    ``tokens_per_second x`` its seconds per grid step (Qwen2.5-VL; 1 for Qwen2-VL), computed
    in the seconds' dtype as the model does. Each run of image (video) placeholders must hold
    its grid's ``t x h x w / merge^2`` tokens; a mismatch is one line naming ``where``."""
    if isinstance(merge, bool) or not isinstance(merge, int | np.integer) or merge < 1:
        raise InputError(f"{where}: the merge size must be a positive integer, not {merge!r}")
    kinds = _integers(_tensor(types, "mm_token_type_ids", where), "mm_token_type_ids", where)
    if kinds.ndim != 1:
        raise InputError(f"{where}: mm_token_type_ids must be one row, not shape "
                         f"{tuple(kinds.shape)}")  # fmt: skip
    types = kinds.cpu().numpy()
    out = np.empty((3, len(types)), dtype=np.int64)
    if len(types) == 0:
        return out
    odd = np.flatnonzero((types < 0) | (types > 2))
    if len(odd):
        raise InputError(f"{where}: mm_token_type_ids[{int(odd[0])}] is {int(types[odd[0]])}; "
                         "token types are 0 (text), 1 (image) and 2 (video)")  # fmt: skip
    none = np.zeros((0, 3), dtype=np.int64)
    grids = {1: none if image_grid is None else _grids(image_grid, "image_grid_thw", where, merge),
             2: none if video_grid is None else _grids(video_grid, "video_grid_thw", where, merge)}  # fmt: skip
    seconds = _seconds(video_seconds, len(grids[2]), where)
    edges = np.flatnonzero(np.diff(types)) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [len(types)]))
    runs = {c: [(a, b) for a, b in zip(starts, ends, strict=True) if types[a] == c] for c in (1, 2)}
    for code, name in ((1, "image_grid_thw"), (2, "video_grid_thw")):
        have, want = len(runs[code]), len(grids[code])
        if have != want:
            raise InputError(f"{where}: {have} runs of type-{code} placeholder tokens, {want} "
                             f"grids in {name}; each image (video) is one run between text tokens")  # fmt: skip
        for k, ((a, b), (t, h, w)) in enumerate(zip(runs[code], grids[code], strict=True)):
            if b - a != t * h * w // (merge * merge):
                raise InputError(f"{where}: {name}[{k}] {[int(t), int(h), int(w)]} makes "
                                 f"{t * h * w // (merge * merge)} placeholder tokens, its run "
                                 f"holds {b - a}")  # fmt: skip
    used = {1: 0, 2: 0}
    pos = 0
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        kind = int(types[a])
        if kind == 0:
            out[:, a:b] = np.arange(b - a) + pos
            pos += b - a
            continue
        j = used[kind]
        used[kind] += 1
        t, h, w = (int(v) for v in grids[kind][j])
        gh, gw = h // merge, w // merge
        frames = np.arange(t)
        if kind == 2 and tokens_per_second is not None:
            # as get_rope_index: tokens_per_second x the seconds, in the seconds' dtype (the
            # processor's float32), times the frame index, truncated
            sec = seconds[j] if seconds is not None else np.float32(1.0)
            step = np.asarray(tokens_per_second).astype(sec.dtype) * sec
            frames = (frames.astype(sec.dtype) * step).astype(np.int64)
        tt, hh, ww = np.meshgrid(frames + pos, np.arange(gh) + pos, np.arange(gw) + pos,
                                 indexing="ij")  # fmt: skip
        out[:, a:b] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()])
        pos += max(h, w) // merge
    return out


def _seconds(x: Any, videos: int, where: str) -> np.ndarray | None:
    """A sample's ``second_per_grid_ts``: one finite value >= 0 per video (None: not given)."""
    if x is None:
        return None
    sec = _tensor(x, "second_per_grid_ts", where).reshape(-1)
    if not sec.is_floating_point():
        sec = sec.to(torch.float32)
    values = sec.cpu().numpy()
    if len(values) != videos:
        raise InputError(f"{where}: second_per_grid_ts gives {len(values)} values for {videos} "
                         "videos; give one per video")  # fmt: skip
    if not np.isfinite(values).all() or (values < 0).any():
        raise InputError(f"{where}: second_per_grid_ts holds {values.tolist()}; give finite "
                         "seconds >= 0")  # fmt: skip
    return values


def _checked(sample: Mapping[str, Any], where: str, merge: int) -> dict[str, Any]:
    """One sample's tensors, checked against each other (token ids, types and grids as int64);
    ``own``: whether it gives its own labels."""
    if not isinstance(sample, Mapping):
        raise InputError(f"{where}: a sample is a mapping of the processor's outputs, not "
                         f"{type(sample).__name__}")  # fmt: skip
    if sample.get("input_ids") is None or sample.get("mm_token_type_ids") is None:
        raise InputError(f"{where}: give input_ids and mm_token_type_ids (the processor's)")
    ids = _row(sample["input_ids"], "input_ids", where)
    types = _row(sample["mm_token_type_ids"], "mm_token_type_ids", where)
    if types.shape != ids.shape:
        raise InputError(f"{where}: mm_token_type_ids has {types.numel()} tokens, input_ids "
                         f"{ids.numel()}")  # fmt: skip
    out: dict[str, Any] = {"input_ids": ids, "mm_token_type_ids": types}
    for pixels, grid, _ in _VISION:
        if (sample.get(pixels) is None) != (sample.get(grid) is None):
            raise InputError(f"{where}: give {pixels} and {grid} together")
        if sample.get(grid) is None:
            continue
        g = _grids(sample[grid], grid, where, merge)
        values = _tensor(sample[pixels], pixels, where)
        rows = int(g.prod(axis=1).sum())
        if values.ndim != 2 or values.shape[0] != rows:
            raise InputError(f"{where}: {pixels} has shape {tuple(values.shape)}, its {grid} "
                             f"{rows} patches: give one row per patch")  # fmt: skip
        out[pixels], out[grid] = values, torch.from_numpy(g)
    seconds = sample.get("second_per_grid_ts")
    if seconds is not None and "video_grid_thw" not in out:
        raise InputError(f"{where}: second_per_grid_ts without videos (video_grid_thw)")
    out["seconds"] = _seconds(seconds, len(out.get("video_grid_thw", ())), where)
    labels = sample.get("labels")
    out["own"] = labels is not None
    out["labels"] = ids if labels is None else _row(labels, "labels", where)
    if out["labels"].shape != ids.shape:
        raise InputError(f"{where}: labels has {out['labels'].numel()} tokens, input_ids "
                         f"{ids.numel()}")  # fmt: skip
    return out


@dataclass
class VisionBatch(PackedBatch):
    """A packed micro-batch of vision-language samples (Qwen2-VL, Qwen2.5-VL): the text fields
    of :class:`~varpack.torch.batch.PackedBatch` (``position_ids``: the text positions, ``[1,
    N]``, restarting with every sample) and what the model's vision side takes. ``labels`` are
    the samples' own where the dataset gives them (say, with the image placeholders set to
    ``IGNORE_INDEX``), else their ``input_ids``; every sample's first token and the padding tail
    are ``IGNORE_INDEX``. :func:`~varpack.torch.hf.hf_inputs` gives the model all of it."""

    mm_token_type_ids: torch.Tensor  # int64 [1, N]: 0 text, 1 image, 2 video (padding: 0)
    rope_positions: torch.Tensor  # int64 [3, 1, N]: each sample's multimodal RoPE positions
    micro_label_tokens: int  # supervised tokens of this micro-batch
    own_labels: bool  # some sample gave its own labels
    pixel_values: torch.Tensor | None = field(default=None, kw_only=True)  # [patches, D]
    image_grid_thw: torch.Tensor | None = field(default=None, kw_only=True)  # int64 [images, 3]
    pixel_values_videos: torch.Tensor | None = field(default=None, kw_only=True)
    video_grid_thw: torch.Tensor | None = field(default=None, kw_only=True)
    second_per_grid_ts: torch.Tensor | None = field(default=None, kw_only=True)  # one per video

    @property
    def label_tokens(self) -> int:
        """Supervised tokens of the whole global step, where the samples' labels are their
        tokens (the plan knows them); samples that give their own labels supervise fewer, which
        only they know: sum :attr:`micro_label_tokens` over the step's micro-batches and ranks."""
        if self.own_labels:
            raise InputError(
                f"step {self.step}: the samples give their own labels, so the plan does not know "
                "the step's supervised tokens; sum micro_label_tokens over the step's "
                "micro-batches and all-reduce it over the ranks"
            )
        return super().label_tokens

    def model_inputs(self) -> dict[str, Any]:
        """What the model takes beyond the text inputs: ``position_ids`` ``[4, 1, N]`` (the text
        positions over the multimodal ones, as transformers takes packed Qwen2-VL input),
        ``mm_token_type_ids`` and the vision tensors this micro-batch holds."""
        pos = torch.cat([self.position_ids.view(1, 1, -1), self.rope_positions], 0)
        out: dict[str, Any] = {"position_ids": pos, "mm_token_type_ids": self.mm_token_type_ids}
        for name in VISION_FIELDS:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


#: the vision tensors a :class:`VisionBatch` may hold, by the model's argument names
VISION_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                 "second_per_grid_ts")  # fmt: skip


def vision_fields(
    parts: Sequence[dict[str, Any]], pad_to: int, pad_id: int, merge: int, tps: float | None
) -> dict[str, Any]:
    """A :class:`VisionBatch`'s tensor fields from checked samples (:func:`checked_sample`),
    packed into one row of ``pad_to`` tokens (the padding tail one segment of text)."""
    lens = np.array([p["input_ids"].numel() for p in parts], dtype=np.int64)
    tokens = torch.cat([p["input_ids"] for p in parts]).numpy()
    fields = pack_packed(tokens, lens, pad_to, pad_id)
    n = int(lens.sum())
    labels = fields["labels"]
    own = any(p["own"] for p in parts)
    if own:
        labels[:n] = torch.cat([p["labels"] for p in parts]).numpy()
        labels[fields["cu_seqlens"][: len(parts)]] = IGNORE_INDEX
    types = np.zeros(pad_to, dtype=np.int64)
    types[:n] = torch.cat([p["mm_token_type_ids"] for p in parts]).numpy()
    rope = np.empty((3, pad_to), dtype=np.int64)
    rope[:, n:] = np.arange(pad_to - n)  # the padding tail: a text segment of its own
    at = 0
    for i, p in enumerate(parts):
        m = p["input_ids"].numel()
        rope[:, at : at + m] = mrope_positions(
            p["mm_token_type_ids"], p.get("image_grid_thw"), p.get("video_grid_thw"), merge,
            p["seconds"], tps, p.get("where", f"sample {i}"))  # fmt: skip
        at += m
    out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in fields.items()}
    for key in ("input_ids", "position_ids", "labels"):
        out[key] = out[key].view(1, -1)
    out.update(
        mm_token_type_ids=torch.from_numpy(types).view(1, -1),
        rope_positions=torch.from_numpy(rope).view(3, 1, -1),
        micro_label_tokens=int((labels != IGNORE_INDEX).sum()),
        own_labels=own,
    )
    for pixels, grid, _ in _VISION:
        held = [p for p in parts if grid in p]
        if held:
            widths = {tuple(p[pixels].shape[1:]) for p in held}
            if len(widths) > 1:
                raise InputError(f"{pixels} rows differ in width across samples "
                                 f"({sorted(widths)}); give one processor's outputs")  # fmt: skip
            out[pixels] = torch.cat([p[pixels] for p in held], 0)
            out[grid] = torch.cat([p[grid] for p in held], 0)
    if any(p["seconds"] is not None for p in parts):  # one per video, in order (1 s: unsaid)
        out["second_per_grid_ts"] = torch.cat([
            torch.from_numpy(p["seconds"]) if p["seconds"] is not None
            else torch.ones(len(p["video_grid_thw"]))
            for p in parts if "video_grid_thw" in p
        ])  # fmt: skip
    return out


def read_vision(
    row: RowInfo, dataset: Any, pad_id: int, merge: int, tps: float | None
) -> VisionBatch:
    """The :class:`VisionBatch` of manifest row ``row``: each sample is ``dataset[sample_id]``
    (the processor's outputs, made where the dataset makes them: in the DataLoader workers),
    checked, its tokens counted against the plan's, packed to the row's ``pad_to``."""
    ids = row.sample_ids
    parts = [
        checked_sample(dataset[int(s)], f"{row.where()}: sample id {int(s)}", merge) for s in ids
    ]
    lens = np.array([p["input_ids"].numel() for p in parts], dtype=np.int64)
    check_lengths(row, ids, row.seq_lens.astype(np.int64), lens)
    fields = vision_fields(parts, row.pad_to, pad_id, merge, tps)
    return VisionBatch(**info_tensors(row_info(row, ids, lens)), **fields)


def checked_sample(sample: Mapping[str, Any], where: str, merge: int) -> dict[str, Any]:
    """One sample (a processor's output) checked for :func:`vision_fields`; ``where`` names it
    in a message."""
    out = _checked(sample, where, merge)
    out["where"] = where
    return out


def vision_settings(model: Any) -> tuple[int, float | None]:
    """``(spatial_merge_size, tokens_per_second)`` of a Qwen2-VL / Qwen2.5-VL model or config."""
    return _vision_settings(model)


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
    ``dtype``: the additive mask's for ``eager``; ``labels``: add the packed labels. The
    reader's :class:`VisionBatch` is the same row with the plan's bookkeeping
    (``PlanLoader(..., vision=config)``)."""
    if not samples:
        raise InputError("pack_vlm: no samples to pack")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"pack_vlm: dtype={dtype!r}: the mask's dtype is a float dtype")
    merge, tps = _vision_settings(model)
    hf_attention_kind(attn_implementation)
    parts = [checked_sample(s, f"sample {i}", merge) for i, s in enumerate(samples)]
    lens = torch.tensor([p["input_ids"].numel() for p in parts])
    total = int(lens.sum())
    fields = vision_fields(parts, total, 0, merge, tps)
    batch = VisionBatch(
        step=0, micro=0, lr_factor=1.0, step_tokens=total, step_samples=len(parts),
        is_last_micro=True, warmup=False, epoch=0, sample_ids=torch.arange(len(parts)),
        seq_lens=lens.to(torch.int32), **fields)  # fmt: skip
    return hf_inputs(batch, attn_implementation, dtype=dtype, labels=labels)


__all__ = ["IGNORE_INDEX", "VisionBatch", "mrope_positions", "pack_vlm", "vision_fields"]
