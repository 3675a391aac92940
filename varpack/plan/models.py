"""Model dimensions for the FLOPs cost model, and presets of real models.

Imports nothing from varpack: the config names the presets in its help, the cost model uses the
dimensions, and neither needs the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    """Transformer dimensions used by the FLOPs model (kv_hidden = kv heads x head dim)."""

    hidden: int
    kv_hidden: int
    layers: int


#: Real model configurations (from their published config.json files).
PRESETS: dict[str, ModelDims] = {
    "qwen2.5-0.5b": ModelDims(hidden=896, kv_hidden=128, layers=24),
    "qwen2.5-1.5b": ModelDims(hidden=1536, kv_hidden=256, layers=28),
    "qwen2.5-7b": ModelDims(hidden=3584, kv_hidden=512, layers=28),
    "llama-3-8b": ModelDims(hidden=4096, kv_hidden=1024, layers=32),
    "llama-3-70b": ModelDims(hidden=8192, kv_hidden=1024, layers=80),
}
