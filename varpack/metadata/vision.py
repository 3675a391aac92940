"""A vision-language sample's images in the metadata: the ``vision_patches`` column.

``vision_patches`` holds each sample's images (or videos), each by its patches before merging
(``t x h x w`` of its ``grid_thw``); null or empty for a text-only sample. Here:

* :func:`image_grids`: the grids Qwen2-VL's and Qwen2.5-VL's image processor makes of images
  of ``height x width`` pixels, without decoding them. The processor resizes an image so that
  both sides are multiples of ``patch x merge`` pixels and its area lies within
  ``[min_pixels, max_pixels]``, keeping its aspect ratio as closely as it can (transformers'
  ``smart_resize``; here for an array of sizes, the same float64 operations in the same
  order, so the same rounding); an image is one temporal patch, so its grid is ``(1, h, w)``
  and its placeholder tokens ``h x w / merge^2``. The settings must be the ones training uses;
* :func:`patch_lists`, :func:`patch_totals`: the column read and checked (any integer list
  type; a sorted output's integer totals), and each sample's total, the key a sort orders by;
* :func:`vision_summary`, :func:`render_vision`: what ``varpack check`` says of the images;
* :func:`grid_patch_lists`: the column from a dataset's grid columns (the processor's
  ``image_grid_thw``), for ``varpack lengths --grid-column``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from varpack.errors import ConfigError, InputError

#: the metadata column of each sample's images: each one's patches before merging (t x h x w)
VISION = "vision_patches"

#: transformers' Qwen2-VL image processor defaults
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
PATCH = 14
MERGE = 2
#: the longest side over the shortest the processor accepts
MAX_RATIO = 200


class Grids(NamedTuple):
    """Each image's grid: ``h`` and ``w`` in patches (``t`` is 1 for an image)."""

    h: np.ndarray
    w: np.ndarray
    merge: int

    @property
    def patches(self) -> np.ndarray:
        """Patches of each image before merging (``t x h x w``): the vision tower's length."""
        return self.h * self.w

    @property
    def tokens(self) -> np.ndarray:
        """Placeholder tokens of each image in the text (its patches over ``merge^2``)."""
        return self.patches // (self.merge * self.merge)


def image_grids(
    heights: np.ndarray,
    widths: np.ndarray,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    patch: int = PATCH,
    merge: int = MERGE,
) -> Grids:
    """The patch grid of each image of ``heights x widths`` pixels, as the processor makes it.

    >>> g = image_grids(np.array([480, 28, 4000]), np.array([640, 28, 3000]))
    >>> g.h.tolist(), g.w.tolist(), g.patches.tolist(), g.tokens.tolist()
    ([34, 4, 82], [46, 4, 60], [1564, 16, 4920], [391, 4, 1230])
    """
    for name, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels), ("patch", patch),
                    ("merge", merge)):  # fmt: skip
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise InputError(f"image grids: {name} must be a positive integer, not {v!r}")
    if min_pixels > max_pixels:
        raise InputError(f"image grids: min_pixels {min_pixels} exceeds max_pixels {max_pixels}")
    h = np.asarray(heights)
    w = np.asarray(widths)
    if h.shape != w.shape or h.ndim != 1:
        raise InputError(
            f"image grids: give one height and one width per image (shapes {h.shape}, {w.shape})"
        )
    for name, side in (("height", h), ("width", w)):
        if len(side) and (side.dtype.kind not in "iu" or int(side.min()) < 1):
            wrong = side.dtype.kind not in "iu" or side < 1
            bad = int(np.flatnonzero(np.broadcast_to(wrong, side.shape))[0])
            raise InputError(f"image grids: image {bad}: its {name} must be a positive integer "
                             f"number of pixels, not {side[bad]!r}")  # fmt: skip
    hf = h.astype(np.float64)
    wf = w.astype(np.float64)
    ratio = np.maximum(hf, wf) / np.minimum(hf, wf) if len(h) else hf
    if len(h) and float(ratio.max()) > MAX_RATIO:
        i = int(np.argmax(ratio))
        raise InputError(
            f"image grids: image {i} is {int(h[i])} x {int(w[i])} pixels, an aspect ratio of "
            f"{ratio[i]:.0f}; the processor refuses more than {MAX_RATIO}"
        )
    factor = float(patch * merge)
    hb = np.round(hf / factor) * factor
    wb = np.round(wf / factor) * factor
    over = hb * wb > max_pixels
    under = ~over & (hb * wb < min_pixels)
    beta = np.sqrt(hf * wf / max_pixels)
    hb = np.where(over, np.maximum(factor, np.floor(hf / beta / factor) * factor), hb)
    wb = np.where(over, np.maximum(factor, np.floor(wf / beta / factor) * factor), wb)
    beta = np.sqrt(min_pixels / (hf * wf))
    hb = np.where(under, np.ceil(hf * beta / factor) * factor, hb)
    wb = np.where(under, np.ceil(wf * beta / factor) * factor, wb)
    return Grids((hb / patch).astype(np.int64), (wb / patch).astype(np.int64), merge)


def is_patch_list(typ: pa.DataType) -> bool:
    """Is ``typ`` a list of integers (the type of :data:`VISION`)?"""
    return (pat.is_list(typ) or pat.is_large_list(typ)) and pat.is_integer(typ.value_type)


#: the most patches an image may have (an int32, so a sample's total fits int64 however many
#: images it holds; Qwen2-VL's default max_pixels gives 5,120)
MAX_PATCHES = 2**31 - 1


def is_patch_totals(typ: pa.DataType) -> bool:
    """An integer :data:`VISION` column: each sample's total (as ``varpack sort`` writes it)."""
    return pat.is_integer(typ)


def _outside(values: pa.Array, low: float, high: float) -> pa.Array:
    """Which integers are outside ``[low, high]`` (compared as float64: any integer type, the
    bounds exact)."""
    f = values.cast(pa.float64(), safe=False)
    return pc.or_(pc.less(f, low), pc.greater(f, high))


def patch_lists(col: pa.ChunkedArray | pa.Array, where: str, first_row: int, ids: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``(offsets, patches)`` of a :data:`VISION` column: sample ``i``'s images are
    ``patches[offsets[i]:offsets[i + 1]]``. A null row or an empty list is a sample without
    images; an image's patches are an integer in ``[1, MAX_PATCHES]`` (another, or a null, is
    refused in one line naming the row, sample and image). An integer column holds each
    sample's total (a sorted output's): one entry per sample with patches, totals >= 0."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if is_patch_totals(arr.type):
        return _totals_as_lists(arr, where, first_row, ids)
    if not is_patch_list(arr.type):
        raise InputError(f"{where}: column '{VISION}' has type {arr.type}, expected a list of "
                         "integers (each image's patches)")  # fmt: skip
    counts = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = pc.list_flatten(arr)
    parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    bad = pc.or_kleene(pc.is_null(values), _outside(values, 1, MAX_PATCHES))
    if len(values) and pc.any(bad).as_py():
        k = int(pc.index(bad, True).as_py())
        row = int(parents[k])
        raise InputError(
            f"{where}: row {first_row + row} (sample_id {int(ids[row])}): image "
            f"{k - int(offsets[row])} has {values[k].as_py()} patches in '{VISION}'; each image "
            f"needs its patches (t x h x w of its grid, 1 to {MAX_PATCHES:,})"
        )
    return offsets, values.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _totals_as_lists(arr: pa.Array, where: str, first_row: int, ids: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per-sample totals as lists of one entry (none for a total of 0 or null)."""
    bad = _outside(arr, 0, float(2**62))
    if len(arr) and pc.any(bad).as_py():
        row = int(pc.index(bad, True).as_py())
        raise InputError(f"{where}: row {first_row + row} (sample_id {int(ids[row])}): "
                         f"'{VISION}' is {arr[row].as_py()}; a sample's patches are >= 0 (and below 2^62)")  # fmt: skip
    totals = pc.fill_null(arr, 0).cast(pa.int64()).to_numpy(zero_copy_only=False)
    held = totals > 0
    offsets = np.zeros(len(totals) + 1, dtype=np.int64)
    np.cumsum(held, out=offsets[1:])
    return offsets, totals[held]


def patch_totals(col: pa.ChunkedArray | pa.Array, where: str, first_row: int, ids: np.ndarray
                 ) -> pa.Array:  # fmt: skip
    """Each sample's patches over all its images (int64; 0 without images): the key a sort
    by :data:`VISION` orders by."""
    offsets, patches = patch_lists(col, where, first_row, ids)
    sums = np.concatenate(([0], np.cumsum(patches)))
    return pa.array(sums[offsets[1:]] - sums[offsets[:-1]], type=pa.int64())


def vision_summary(files: list[str], ids: np.ndarray | None = None) -> dict[str, float] | None:
    """The images of the metadata ``files`` (their :data:`VISION` column, checked as
    :func:`patch_lists` does; a file without it holds text-only samples; None where no file
    has one): samples with images, images, and the patches' total, percentiles and maximum per
    image. Where the column holds each sample's total (a sorted output), ``per`` is
    ``"sample"`` and the figures are per sample. ``ids``: count only these samples."""
    import pyarrow.parquet as pq

    have = [VISION in pq.read_schema(f).names for f in files]
    if not any(have):
        return None
    held, parts_val, kinds = [], [], set()
    for f, has in zip(files, have, strict=True):
        table = pq.read_table(f, columns=["sample_id", VISION] if has else ["sample_id"])
        sid = table.column("sample_id").to_numpy()
        if has:
            col = table.column(VISION)
            kinds.add(is_patch_totals(col.type))
            if len(kinds) > 1:
                raise InputError(f"{f}: '{VISION}' holds each sample's total here and its images "
                                 "in other files; give metadata of one kind")  # fmt: skip
            offsets, patches = patch_lists(col, f, 0, sid)
        else:
            offsets, patches = np.zeros(len(sid) + 1, np.int64), np.zeros(0, np.int64)
        keep = np.ones(len(sid), dtype=bool) if ids is None else np.isin(sid, ids)
        counts = np.diff(offsets)
        held.append(counts[keep])
        parts_val.append(patches[np.repeat(keep, counts)])
    counts = np.concatenate(held)
    patches = np.concatenate(parts_val)
    totals = True in kinds
    out: dict[str, float | str] = {"samples_with_images": int((counts > 0).sum()),
                                   "samples": int(len(counts)), "images": int(len(patches)),
                                   "patches": int(patches.sum()),
                                   "per": "sample" if totals else "image"}  # fmt: skip
    if totals:
        del out["images"]
    if len(patches):
        p50, p99 = np.percentile(patches, [50, 99])
        out.update(min=int(patches.min()), p50=float(p50), p99=float(p99),
                   max=int(patches.max()), most_images=int(counts.max()))  # fmt: skip
        if totals:
            del out["most_images"]
    return out  # type: ignore[return-value]


def render_vision(v: dict[str, float]) -> str:
    """``varpack check``'s lines for the images."""
    share = v["samples_with_images"] / max(v["samples"], 1)
    per = v.get("per", "image")
    held = f"{int(v['images']):,} in " if per == "image" else "in "
    line = (f"images       {held}{int(v['samples_with_images']):,} samples ({share:.1%}), "
            f"{int(v['patches']):,} patches")  # fmt: skip
    if "min" in v:
        line += (f"\npatches      per {per} min {int(v['min']):,}  p50 {v['p50']:,.0f}  "
                 f"p99 {v['p99']:,.0f}  max {int(v['max']):,}")  # fmt: skip
        if per == "image":
            line += f"; at most {int(v['most_images'])} images a sample"
        else:
            line += " (each sample's total: its images are not told apart)"
    return line


#: the metadata type of :data:`VISION` as ``varpack lengths`` writes it
PATCH_LIST = pa.list_(pa.int64())


def _is_grid_list(typ: pa.DataType) -> bool:
    """A list of integer lists (each image's ``[t, h, w]``)?"""
    if not (pat.is_list(typ) or pat.is_large_list(typ)):
        return False
    inner = typ.value_type
    listed = pat.is_list(inner) or pat.is_large_list(inner) or pat.is_fixed_size_list(inner)
    return listed and pat.is_integer(inner.value_type)


def check_grid_names(grids: Sequence[str], taken: Sequence[str | None]) -> None:
    """Grid columns named once each, none of them a column taken otherwise (the token, id and
    kept columns, the metadata's own)."""
    if grids and VISION in taken:
        raise ConfigError(f"--keep {VISION}: --grid-column writes {VISION} from the grids; keep "
                          "one or the other")  # fmt: skip
    seen: set[str] = set()
    for name in grids:
        if name in seen:
            raise ConfigError(f"--grid-column {name}: named twice")
        if name in (*taken, "sample_id", "seq_len", VISION):
            raise ConfigError(f"--grid-column {name}: also the token, id or a kept column; give "
                              "the column of each sample's [t, h, w] grids (image_grid_thw)")  # fmt: skip
        seen.add(name)


def check_grid_schema(schema: pa.Schema, names: Sequence[str], where: str) -> None:
    """Every grid column is in ``schema`` as a list of integer lists."""
    for name in names:
        if schema.get_field_index(name) < 0:
            raise InputError(f"{where}: --grid-column {name}: no such column (columns: "
                             f"{', '.join(schema.names)})")  # fmt: skip
        if not _is_grid_list(schema.field(name).type):
            raise InputError(_grid_type(where, name, schema.field(name).type))


def _grid_type(where: str, name: str, typ: pa.DataType) -> str:
    return (f"{where}: --grid-column {name} has type {typ}; give each sample's grids as a list "
            "of [t, h, w] integer lists (the processor's image_grid_thw)")  # fmt: skip


def _grid_patches(col: pa.ChunkedArray, name: str, where: str, first_row: int
                  ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``(counts, patches)`` of a grid column (each sample's ``[t, h, w]`` per image): images
    per sample and each image's ``t x h x w``, in order."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not _is_grid_list(arr.type):
        raise InputError(_grid_type(where, name, arr.type))
    counts = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    images = pc.list_flatten(arr)
    rows = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    sizes = pc.fill_null(pc.list_value_length(images), 0).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(images)
    bad = np.flatnonzero((sizes != 3) | pc.is_null(images).to_numpy(zero_copy_only=False))
    if len(bad) == 0 and len(values):
        out = _outside(values, 1, MAX_PATCHES)
        small = pc.or_kleene(pc.is_null(values), out).to_numpy(zero_copy_only=False)
        wide = values.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False).reshape(-1, 3)
        bad = np.flatnonzero(small.reshape(-1, 3).any(axis=1) | (wide.prod(axis=1) > MAX_PATCHES))
    if len(bad):
        k = int(bad[0])
        row = int(rows[k])
        image = k - int(np.cumsum(counts)[row] - counts[row])
        raise InputError(f"{where}: row {first_row + row}: --grid-column {name}: image {image} is "
                         f"{images[k].as_py()}; each image's grid is [t, h, w], each >= 1, "
                         f"t x h x w at most {MAX_PATCHES:,} patches")  # fmt: skip
    thw = values.cast(pa.int64()).to_numpy(zero_copy_only=False).reshape(-1, 3)
    return counts.astype(np.int64), thw.prod(axis=1)


def grid_patch_lists(table: pa.Table, names: Sequence[str], where: str, first_row: int
                     ) -> pa.Array:  # fmt: skip
    """The :data:`VISION` column of one row group from its grid columns ``names`` (e.g.
    ``image_grid_thw``, ``video_grid_thw``): each sample's images of every column, in the
    order named, by ``t x h x w``."""
    parts = [_grid_patches(table.column(n), n, where, first_row) for n in names]
    counts = sum((c for c, _ in parts), np.zeros(table.num_rows, dtype=np.int64))
    offsets = np.zeros(table.num_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.int64)
    before = np.zeros(table.num_rows, dtype=np.int64)  # entries of earlier columns a sample has
    for c, patches in parts:
        rows = np.repeat(np.arange(table.num_rows), c)
        within = np.arange(len(patches)) - np.repeat(np.cumsum(c) - c, c)
        out[offsets[rows] + before[rows] + within] = patches
        before += c
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(out))
