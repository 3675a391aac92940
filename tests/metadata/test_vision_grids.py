"""Images' patch grids from their sizes: the same grids as Qwen2-VL's own image processor."""

from __future__ import annotations

import numpy as np
import pytest

from varpack.errors import InputError
from varpack.metadata.vision import image_grids


@pytest.mark.torch
@pytest.mark.parametrize(("min_pixels", "max_pixels"), [(56 * 56, 28 * 28 * 1280),
                                                        (64 * 28 * 28, 512 * 28 * 28)])  # fmt: skip
def test_grids_are_the_processors(min_pixels: int, max_pixels: int) -> None:
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    rng = np.random.default_rng(min_pixels)
    sizes = rng.integers(8, 1400, size=(24, 2)).tolist()
    sizes += [[28, 28], [10, 1999], [1000, 6], [1, 150], [27, 29], [2016, 1512]]
    proc = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    out = proc(
        images=[np.zeros((h, w, 3), np.uint8) for h, w in sizes],
        return_tensors="np",
        input_data_format="channels_last",
    )
    g = image_grids(np.array([h for h, _ in sizes]), np.array([w for _, w in sizes]),
                    min_pixels, max_pixels)  # fmt: skip
    thw = np.asarray(out["image_grid_thw"])
    assert (thw[:, 0] == 1).all()
    assert thw[:, 1].tolist() == g.h.tolist() and thw[:, 2].tolist() == g.w.tolist()
    assert int(g.patches.sum()) == out["pixel_values"].shape[0]  # the tower's rows
    assert (g.tokens * 4 == g.patches).all()


@pytest.mark.parametrize(
    ("heights", "widths", "kw", "message"),
    [
        ([10, 3000], [10, 14], {}, "image 1 is 3000 x 14 pixels, an aspect ratio of 214"),
        ([10, 0], [10, 10], {}, "image 1: its height must be a positive integer"),
        ([10.5], [10], {}, "image 0: its height must be a positive integer"),
        ([10, 20], [10], {}, "one height and one width per image"),
        ([10], [10], {"max_pixels": 0}, "max_pixels must be a positive integer"),
        ([10], [10], {"min_pixels": 5000, "max_pixels": 4000}, "min_pixels 5000 exceeds"),
    ],
)
def test_bad_sizes_and_settings_are_one_line(heights: list[float], widths: list[int],
                                             kw: dict[str, int], message: str) -> None:  # fmt: skip
    with pytest.raises(InputError) as err:
        image_grids(np.array(heights), np.array(widths), **kw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_no_images_give_empty_grids() -> None:
    g = image_grids(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert g.patches.tolist() == [] and g.tokens.tolist() == []
