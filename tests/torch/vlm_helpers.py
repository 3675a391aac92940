"""Test helpers for vision-language samples: tiny random Qwen2-VL / Qwen2.5-VL models
(transformers 5, CPU, fp32) and samples as their processors return them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers

IMAGE, VIDEO, START, END = 120, 121, 122, 123
PATCH_IN = 3 * 2 * 4 * 4  # channels x temporal x patch^2


def model_of(kind: str, attn: str) -> Any:
    text = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128,
            "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                "rope_theta": 10000.0}}  # fmt: skip
    vision = {"depth": 2, "num_heads": 4, "patch_size": 4, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "in_channels": 3}  # fmt: skip
    tokens = {"image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": START,
              "vision_end_token_id": END}  # fmt: skip
    if kind == "qwen2_vl":
        config = transformers.Qwen2VLConfig(
            text_config=text, vision_config={**vision, "embed_dim": 32, "hidden_size": 64},
            **tokens)  # fmt: skip
        cls = transformers.Qwen2VLForConditionalGeneration
    else:
        config = transformers.Qwen2_5_VLConfig(
            text_config=text,
            vision_config={**vision, "hidden_size": 32, "intermediate_size": 40,
                           "out_hidden_size": 64, "window_size": 16,
                           "fullatt_block_indexes": [1]},
            **tokens)  # fmt: skip
        cls = transformers.Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(0)
    return cls._from_config(config, attn_implementation=attn, dtype=torch.float32).eval()


def sample(rng: np.random.Generator, text: int, grids: list[tuple[int, int, int]],
            videos: tuple[tuple[int, int, int], ...] = ()) -> dict:  # fmt: skip
    """Text, then each image (then video) between its start and end tokens, then more text."""
    ids: list[int] = list(rng.integers(0, 100, text))
    types = [0] * text
    for kind, token, items in ((1, IMAGE, grids), (2, VIDEO, videos)):
        for t, h, w in items:
            n = t * h * w // 4
            ids += [START] + [token] * n + [END] + list(rng.integers(0, 100, 3))
            types += [0] + [kind] * n + [0] * 4
    out: dict[str, Any] = {"input_ids": torch.tensor([ids]),
                           "mm_token_type_ids": torch.tensor([types])}  # fmt: skip
    for pixels, grid, items in (("pixel_values", "image_grid_thw", grids),
                                ("pixel_values_videos", "video_grid_thw", videos)):  # fmt: skip
        if items:
            rows = sum(t * h * w for t, h, w in items)
            values = rng.standard_normal((rows, PATCH_IN))
            out[pixels] = torch.tensor(values, dtype=torch.float32)
            out[grid] = torch.tensor(list(items))
    if videos:
        out["second_per_grid_ts"] = torch.tensor([0.5 + i for i in range(len(videos))])
    return out


def some_samples(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [sample(rng, 5, [(1, 4, 4)]), sample(rng, 7, []),  # a text-only sample
            sample(rng, 3, [(1, 8, 4), (1, 2, 2)]), sample(rng, 2, [(1, 4, 8)]),
            sample(rng, 4, [(1, 2, 4)], videos=((3, 4, 4), (2, 2, 6)))]  # fmt: skip
