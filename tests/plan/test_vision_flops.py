"""The vision tower's FLOPs, checked against transformers' own Qwen2-VL and Qwen2.5-VL towers.

The oracle is the tower transformers 5 builds from a vision config (small random sizes, real
weights on the CPU, eager attention so every matmul is an ``mm`` / ``addmm`` / ``bmm`` and the
patch embedding a ``convolution``), run under torch's ``FlopCounterMode`` on images of chosen
grids: the counted forward FLOPs equal :func:`vision_forward_flops` of the images' patch
counts exactly where the planner's view is exact (images, ``t = 1``; Qwen2.5-VL's windows full),
and bound them from above elsewhere (a video attends inside each frame; a window at an edge
holds fewer patches).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from varpack.errors import ConfigError
from varpack.plan.models import spec_from_config
from varpack.plan.models.vision import VisionSpec, vision_forward_flops, vision_from_config

TOWERS: dict[str, dict[str, Any]] = {
    "qwen2_vl": {"depth": 3, "embed_dim": 32, "hidden_size": 48, "num_heads": 4, "mlp_ratio": 4,
                 "in_channels": 3, "patch_size": 4, "spatial_merge_size": 2,
                 "temporal_patch_size": 2},
    "qwen2_5_vl": {"depth": 4, "hidden_size": 32, "intermediate_size": 40, "num_heads": 4,
                   "out_hidden_size": 48, "in_channels": 3, "patch_size": 4,
                   "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16,
                   "fullatt_block_indexes": [1, 3]},
}  # fmt: skip
#: grids (t, h, w) of one sample's images whose patch counts say their cost exactly: images,
#: sides a multiple of Qwen2.5-VL's window (4 patches here), or smaller than one window
EXACT = ([[1, 8, 8]], [[1, 4, 8], [1, 16, 8]], [[1, 2, 2]], [[1, 8, 16], [1, 16, 16], [1, 2, 4]])
#: a video (attends inside each frame) and images with a part-filled window at an edge
BOUNDED = ([[3, 8, 8]], [[1, 6, 10]], [[2, 6, 6], [1, 2, 6]])


def _tower(kind: str) -> Any:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if kind == "qwen2_vl":
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig as C
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel as M,
        )
    else:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import (
            Qwen2_5_VLVisionConfig as C,
        )
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel as M,
        )
    torch.manual_seed(0)
    return M._from_config(C(**TOWERS[kind]), attn_implementation="eager")


def _counted(model: Any, grids: list[list[int]], patch_in: int) -> float:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    n = sum(t * h * w for t, h, w in grids)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(n, patch_in), grid_thw=torch.tensor(grids))
    ops = {str(k) for k in counter.get_flop_counts()["Global"]}
    assert ops <= {"aten.mm", "aten.addmm", "aten.bmm", "aten.convolution"}, sorted(ops)
    return float(counter.get_total_flops())


@pytest.mark.torch
@pytest.mark.parametrize("kind", sorted(TOWERS))
def test_flops_match_transformers_tower(kind: str) -> None:
    spec = vision_from_config({"model_type": kind, "vision_config": TOWERS[kind]})
    assert spec is not None
    model = _tower(kind)
    for grids in EXACT:
        patches = np.array([t * h * w for t, h, w in grids])
        want = float(vision_forward_flops(patches, spec).total.sum())
        assert _counted(model, grids, spec.patch_in) == pytest.approx(want, rel=1e-12), grids
    for grids in BOUNDED:
        patches = np.array([t * h * w for t, h, w in grids])
        bound = float(vision_forward_flops(patches, spec).total.sum())
        got = _counted(model, grids, spec.patch_in)
        assert got <= bound * (1 + 1e-12), grids
        assert got < bound or kind == "qwen2_vl" and all(t == 1 for t, _, _ in grids), grids


def _hub(kind: str) -> dict[str, Any]:
    """A config as the Hub's config.json files have it: the language model at the top level."""
    return {"model_type": kind, "hidden_size": 64, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
            "vocab_size": 100, "tie_word_embeddings": True, "vision_config": TOWERS[kind]}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(TOWERS))
def test_the_language_model_reads_as_qwen2_in_either_form(kind: str) -> None:
    hub = _hub(kind)
    spec = spec_from_config(hub)
    text = {k: v for k, v in hub.items() if k not in ("model_type", "vision_config")}
    qwen2 = spec_from_config({"model_type": "qwen2", **text})
    assert spec.model_type == kind
    assert {**spec.to_dict(), "model_type": "qwen2"} == qwen2.to_dict()
    # transformers 5 writes the language model under text_config: the same spec
    nested = {"model_type": kind, "text_config": {**text, "model_type": kind + "_text"},
              "vision_config": TOWERS[kind]}  # fmt: skip
    assert spec_from_config(nested) == spec
    assert vision_from_config(nested) == vision_from_config(hub)


@pytest.mark.torch
@pytest.mark.parametrize("kind", sorted(TOWERS))
def test_the_file_transformers_saves_reads_to_the_same_towers(kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    cls = {"qwen2_vl": transformers.Qwen2VLConfig, "qwen2_5_vl": transformers.Qwen2_5_VLConfig}
    hub = _hub(kind)
    saved = json.loads(cls[kind](**hub).to_json_string())
    assert spec_from_config(saved) == spec_from_config(hub)
    assert vision_from_config(saved) == vision_from_config(hub)


def test_a_hub_qwen2_5_vl_tower_has_its_windows_and_full_blocks() -> None:
    tower = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
             "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
             "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
             "temporal_patch_size": 2}  # fmt: skip
    v = vision_from_config({**_hub("qwen2_5_vl"), "vision_config": tower})
    assert v == VisionSpec("qwen2_5_vl", 1280, 32, 16, 1176, 3420, True, 2, 2048, 8,
                           (7, 15, 23, 31))  # fmt: skip
    assert v.windowed_blocks == 28
    # a window's image attends as much as its patches under full attention, more than 64 less
    small, large = vision_forward_flops(np.array([64, 4096]), v).attention
    assert small == pytest.approx(4.0 * 1280 * 32 * 64 * 64)
    assert large == pytest.approx(4.0 * 1280 * (4 * 4096**2 + 28 * 4096 * 64))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "llava", "vision_config": {}}, "has a vision tower varpack does not cost"),
        ({"model_type": "qwen2_vl"}, "needs its vision_config"),
        ({"model_type": "qwen2_vl", "vision_config": {"depth": 2, "num_heads": 4}},
         "vision_config: no embed_dim; the vision tower's FLOPs need it"),
        ({"model_type": "qwen2_vl", "vision_config": {**TOWERS["qwen2_vl"], "depth": 0}},
         "vision_config: depth is 0; must be an integer >= 1"),
        ({"model_type": "qwen2_vl", "vision_config": {**TOWERS["qwen2_vl"], "num_heads": 5}},
         "5 heads do not divide the width 32"),
        ({"model_type": "qwen2_5_vl",
          "vision_config": {**TOWERS["qwen2_5_vl"], "fullatt_block_indexes": "7"}},
         "fullatt_block_indexes is '7'; must be a list"),
        ({"model_type": "qwen2_5_vl",
          "vision_config": {**TOWERS["qwen2_5_vl"], "fullatt_block_indexes": [9]}},
         "full_blocks must list blocks in [0, 4)"),
        ({"model_type": "qwen2_5_vl",
          "vision_config": {**TOWERS["qwen2_5_vl"], "fullatt_block_indexes": [True]}},
         "fullatt_block_indexes is [True]; must list blocks"),
        ({"model_type": "qwen2_5_vl", "vision_config": {**TOWERS["qwen2_5_vl"], "window_size": 7}},
         "window_size 7 is smaller than a merged patch (8 pixels)"),
        ({"model_type": "qwen2_vl", "text_config": "x", "vision_config": TOWERS["qwen2_vl"]},
         "text_config is 'x'; give the language model's fields as a table"),
    ],
)  # fmt: skip
def test_a_tower_it_cannot_cost_is_refused_in_one_line(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:  # the whole config: its tower, then its text part
        spec_from_config(config, "cfg.json")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("cfg.json: ")


def test_a_shallow_tower_keeps_the_default_full_blocks_it_has() -> None:
    tower = {k: v for k, v in TOWERS["qwen2_5_vl"].items() if k != "fullatt_block_indexes"}
    v = vision_from_config({"model_type": "qwen2_5_vl", "vision_config": {**tower, "depth": 16}})
    assert v is not None and v.full_blocks == (7, 15) and v.windowed_blocks == 14
    v = vision_from_config({"model_type": "qwen2_5_vl", "vision_config": tower})  # depth 4
    assert v is not None and v.full_blocks == () and v.windowed_blocks == 4
    with pytest.raises(ConfigError, match="not a JSON object"):
        vision_from_config([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="full_blocks must list blocks"):
        VisionSpec("qwen2_5_vl", 8, 2, 2, 12, 16, True, 2, 8, 4, (True,))  # type: ignore[arg-type]
