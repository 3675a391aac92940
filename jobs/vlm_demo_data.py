"""The vision-language demo's data: a tokenized dataset of text and images, and a tiny Qwen2-VL.

    python jobs/vlm_demo_data.py OUT [--num-samples 400] [--seed 7]

Writes ``OUT/tokens/part-00000.parquet`` (``sample_id``, ``input_ids``, ``image_grid_thw``,
``image_sizes``: each image's ``[height, width]`` and ``image_seeds``) and ``OUT/model/config.json``
(a Qwen2-VL of two text layers of width 64 and a two-block vision tower). Each sample holds 0-3
synthetic images of 28-140 pixels a side between runs of text; an image's placeholder tokens are
as many as Qwen2-VL's processor makes of it (``varpack.metadata.vision.image_grids``, the
processor's own grids), and its pixels are drawn from its seed, so the trainer makes them again
(``jobs/train_vlm.py``). The text counts up from a random token (mod 100) and carries on after
each image: learnable, so the demo's loss falls.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from varpack.metadata.vision import image_grids

TEXT_VOCAB = 100
IMAGE, VIDEO, START, END = 120, 121, 122, 123
#: the processor's settings the data is made with; the trainer reads them from the config file
MIN_PIXELS, MAX_PIXELS = 28 * 28, 140 * 140
CONFIG = {
    "model_type": "qwen2_vl",
    "image_token_id": IMAGE,
    "video_token_id": VIDEO,
    "vision_start_token_id": START,
    "vision_end_token_id": END,
    "text_config": {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128,
        "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
        "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                            "rope_theta": 10000.0},
    },
    "vision_config": {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 4,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "in_channels": 3},
    "varpack_processor": {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS},
}  # fmt: skip


def samples(n: int, seed: int) -> pa.Table:
    """``n`` samples of text and images (see the module doc)."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("sample_id", "input_ids", "image_grid_thw",  # type: ignore[type-arg]
                                             "image_sizes", "image_seeds")}  # fmt: skip
    for i in range(n):
        k = int(rng.integers(0, 4))
        sizes = rng.integers(28, 141, size=(k, 2))
        g = image_grids(sizes[:, 0], sizes[:, 1], MIN_PIXELS, MAX_PIXELS)
        count = int(rng.integers(0, TEXT_VOCAB))
        ids: list[int] = []
        for j in range(k + 1):
            run = int(rng.integers(8, 80))
            ids += [(count + x) % TEXT_VOCAB for x in range(run)]
            count += run
            if j < k:
                ids += [START] + [IMAGE] * int(g.tokens[j]) + [END]
        rows["sample_id"].append(i)
        rows["input_ids"].append(ids)
        rows["image_grid_thw"].append([[1, int(h), int(w)] for h, w in zip(g.h, g.w, strict=True)])
        rows["image_sizes"].append(sizes.tolist())
        rows["image_seeds"].append(rng.integers(0, 2**31, k).tolist())
    return pa.table({
        "sample_id": pa.array(rows["sample_id"], pa.int64()),
        "input_ids": pa.array(rows["input_ids"], pa.list_(pa.int32())),
        "image_grid_thw": pa.array(rows["image_grid_thw"], pa.list_(pa.list_(pa.int64()))),
        "image_sizes": pa.array(rows["image_sizes"], pa.list_(pa.list_(pa.int64()))),
        "image_seeds": pa.array(rows["image_seeds"], pa.list_(pa.int64())),
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--num-samples", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        print(f"vlm_demo_data: error: {args.out} is not empty; give a new directory",
              file=sys.stderr)  # fmt: skip
        return 2
    (args.out / "tokens").mkdir(parents=True, exist_ok=True)
    (args.out / "model").mkdir(parents=True, exist_ok=True)
    pq.write_table(samples(args.num_samples, args.seed), args.out / "tokens" / "part-00000.parquet")
    (args.out / "model" / "config.json").write_text(json.dumps(CONFIG, indent=2))
    print(f"vlm demo data: {args.num_samples} samples -> {args.out}/tokens, model {args.out}/model")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
