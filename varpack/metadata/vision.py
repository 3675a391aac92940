"""Images' patch grids from their sizes and the processor's settings, without decoding pixels.

Qwen2-VL's and Qwen2.5-VL's image processor resizes an image of ``height x width`` pixels so
that both sides are multiples of ``patch x merge`` pixels and its area lies within
``[min_pixels, max_pixels]``, keeping its aspect ratio as closely as it can (transformers'
``smart_resize``), then cuts it into ``patch x patch`` patches over ``temporal`` frames (an image
is one temporal patch): its ``grid_thw`` is ``(1, h, w)``, its patches ``h x w`` and its
placeholder tokens in the text ``h x w / merge^2``. :func:`image_grids` does the same for an
array of sizes at once (NumPy, the same float64 operations in the same order, so the same
rounding). The settings must be the ones training uses: another ``max_pixels`` is another
number of patches.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from varpack.errors import InputError

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
