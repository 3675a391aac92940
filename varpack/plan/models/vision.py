"""The vision tower of a vision-language model as the FLOPs model reads it: :class:`VisionSpec`.

A Qwen2-VL or Qwen2.5-VL sample holds, beside its text tokens, images (or videos) cut into
patches of ``patch x patch`` pixels over ``temporal`` frames; an image of ``t x h x w`` patches
(its ``grid_thw``) runs through the vision tower alone, and the merger folds every
``merge x merge`` patches into one token of the language model. Forward FLOPs of one image of
``n`` patches (2 FLOPs per multiply-add), as transformers 5 builds the tower
(``models/qwen2_vl``, ``models/qwen2_5_vl``):

* **linear** ``= n x`` (:func:`linear_per_patch`): the patch embedding (a convolution whose
  kernel is the patch: ``2 x patch_in x embed``, ``patch_in = channels x temporal x patch^2``),
  per block the fused q/k/v projection and the output projection (``2 x 4 embed^2``) and the
  MLP (Qwen2-VL: two matmuls of width ``mlp_hidden``; Qwen2.5-VL: gated, three), then the
  merger's two matmuls per merged token (``n / merge^2`` of them, of width ``embed x merge^2``);
* **attention**, bidirectional, inside the image: ``4 x embed x n^2`` per block (scores and
  weighted values); Qwen2.5-VL's windowed blocks attend inside windows of ``window^2``
  patches, ``4 x embed x n x min(n, window^2)``, and its ``full_blocks`` over the image.

The planner knows an image by its patch count ``n = t x h x w`` only. For an image (``t = 1``)
the full attention above is exact, and the windowed one too where the image's sides are
multiples of the window (a window at an edge holds fewer patches: there it is an upper bound).
A video (``t > 1``) attends within each frame's ``h x w`` patches, so pricing it as one
sequence of ``n`` patches over-counts its attention ``t``-fold: an upper bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from varpack.errors import ConfigError
from varpack.plan.models.fields import Fields
from varpack.plan.models.flops import TRAIN_PASSES, Flops

#: the model types whose vision tower varpack costs
VISION_TYPES = ("qwen2_vl", "qwen2_5_vl")


@dataclass(frozen=True)
class VisionSpec:
    """The fields of a Qwen2-VL / Qwen2.5-VL vision tower that its FLOPs depend on.

    ``window``: Qwen2.5-VL's attention window side in patches (0: every block attends over the
    whole image); ``full_blocks``: the blocks that attend over the whole image all the same.
    """

    model_type: str
    embed: int
    depth: int
    heads: int
    patch_in: int
    mlp_hidden: int
    gated: bool
    merge: int
    out_hidden: int
    window: int = 0
    full_blocks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("embed", "depth", "heads", "patch_in", "mlp_hidden", "merge", "out_hidden"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"vision model: {name} must be a positive integer, not {v!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ConfigError(f"vision model: window must be an integer >= 0, not {self.window!r}")
        blocks = self.full_blocks
        if not isinstance(blocks, tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.depth for i in blocks
        ):
            raise ConfigError(
                f"vision model: full_blocks must list blocks in [0, {self.depth}), not {blocks!r}"
            )

    @property
    def windowed_blocks(self) -> int:
        """Blocks that attend inside windows (none without a window)."""
        return self.depth - len(set(self.full_blocks)) if self.window else 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["full_blocks"] = list(self.full_blocks)
        return out

    def describe(self) -> str:
        """One line naming the tower.

        >>> VisionSpec("qwen2_vl", 1280, 32, 16, 1176, 5120, False, 2, 1536).describe()
        'qwen2_vl vision: 32 blocks, embed 1280, 16 heads, MLP 5120, patch 1176 inputs, merge 2x2 -> 1536'
        """
        kind = "gated MLP" if self.gated else "MLP"
        parts = [f"{self.depth} blocks", f"embed {self.embed}", f"{self.heads} heads",
                 f"{kind} {self.mlp_hidden}", f"patch {self.patch_in} inputs",
                 f"merge {self.merge}x{self.merge} -> {self.out_hidden}"]  # fmt: skip
        if self.window:
            parts.append(
                f"windows of {self.window}x{self.window} patches on {self.windowed_blocks} blocks"
            )
        return f"{self.model_type} vision: " + ", ".join(parts)


def linear_per_patch(v: VisionSpec) -> float:
    """Forward matmul FLOPs of one patch: its embedding, every block, its share of the merger.

    >>> linear_per_patch(VisionSpec("qwen2_vl", 8, 1, 2, 12, 32, False, 2, 16))
    2496.0
    """
    blocks = v.depth * (
        2 * 4 * v.embed * v.embed + (3 if v.gated else 2) * 2 * v.embed * v.mlp_hidden
    )
    wide = v.embed * v.merge * v.merge
    merger = (2 * wide * wide + 2 * wide * v.out_hidden) / (v.merge * v.merge)
    return float(2 * v.patch_in * v.embed + blocks) + merger


def attention_flops(patches: np.ndarray, v: VisionSpec) -> np.ndarray:
    """Forward FLOPs of the tower's attention for images of ``patches`` patches each."""
    n = np.asarray(patches, dtype=np.float64)
    windowed = v.windowed_blocks
    full = v.depth - windowed
    out = full * n * n
    if windowed:
        out = out + windowed * n * np.minimum(n, float(v.window * v.window))
    return 4.0 * v.embed * out


def vision_forward_flops(patches: np.ndarray, v: VisionSpec) -> Flops:
    """Forward FLOPs of each image alone (``patches``: its ``t x h x w``), linear and attention."""
    n = np.asarray(patches, dtype=np.float64)
    return Flops(linear_per_patch(v) * n, attention_flops(n, v))


def vision_train_flops(patches: np.ndarray, v: VisionSpec, passes: int = TRAIN_PASSES) -> Flops:
    """FLOPs of training the tower on each image: ``passes`` x the forward (3: fwd + bwd)."""
    f = vision_forward_flops(patches, v)
    return Flops(passes * f.linear, passes * f.attention)


def vision_from_config(config: Mapping[str, Any], where: str = "config") -> VisionSpec | None:
    """The vision tower of a parsed ``qwen2_vl`` / ``qwen2_5_vl`` config.json (None for a
    model without one); the tower's sizes are required, its structure defaults as in
    transformers 5."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: not a JSON object of a model's config")
    model_type = config.get("model_type")
    vc = config.get("vision_config")
    if model_type not in VISION_TYPES:
        if vc is not None:
            raise ConfigError(
                f"{where}: model_type {model_type!r} has a vision tower varpack does not cost "
                f"(it costs {', '.join(VISION_TYPES)}); give its text model's config.json to "
                "cost the language model alone"
            )
        return None
    if not isinstance(vc, Mapping):
        raise ConfigError(f"{where}: a {model_type} config needs its vision_config (a table)")
    f = Fields(vc, f"{where}: vision_config", "the vision tower's FLOPs need it")

    def opt(key: str, default: int, *aliases: str) -> int:  # absent or null: transformers' default
        return f.value(key, default, *aliases) or default

    channels = opt("in_channels", 3, "in_chans")
    temporal = opt("temporal_patch_size", 2)
    patch = opt("patch_size", 14, "spatial_patch_size")
    merge = opt("spatial_merge_size", 2)
    depth = f.size("depth", "num_hidden_layers")
    heads = f.size("num_heads", "num_attention_heads")
    full: tuple[int, ...] = ()
    if model_type == "qwen2_vl":
        embed = f.size("embed_dim")
        mlp = embed * opt("mlp_ratio", 4)
        out = f.size("hidden_size")
        window, gated = 0, False
    else:
        embed = f.size("hidden_size")
        mlp = f.size("intermediate_size")
        out = f.size("out_hidden_size")
        size = opt("window_size", 112)
        window, gated = size // merge // patch * merge, True  # as get_vision_window_index
        if window == 0:
            raise f.fail(f"window_size {size} is smaller than a merged patch ({patch * merge} "
                         "pixels); the model cannot window it")  # fmt: skip
        # transformers' default names blocks 7, 15, 23 and 31; a shallower tower has only some
        listed = f.layer_list("fullatt_block_indexes")
        if listed is None:
            listed = [i for i in (7, 15, 23, 31) if i < depth]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in listed):
            raise f.fail(f"fullatt_block_indexes is {listed!r}; must list blocks")
        full = tuple(listed)
    if embed % heads:
        raise f.fail(f"{heads} heads do not divide the width {embed}")
    try:
        return VisionSpec(model_type, embed, depth, heads, channels * temporal * patch * patch,
                          mlp, gated, merge, out, window, full)  # fmt: skip
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def text_config(config: Mapping[str, Any], where: str = "config") -> Mapping[str, Any]:
    """The language model's fields of a vision-language config: its ``text_config`` where it
    has one (transformers 5 writes it), else the top level (the configs on the Hub), named by
    the vision-language model's type."""
    if config.get("model_type") not in VISION_TYPES or "text_config" not in config:
        return config
    inner = config["text_config"]
    if not isinstance(inner, Mapping):
        raise ConfigError(f"{where}: text_config is {inner!r}; give the language model's fields "
                          "as a table (or at the top level)")  # fmt: skip
    return {**inner, "model_type": config["model_type"]}
