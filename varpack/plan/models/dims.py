"""The three dimensions of Skrull's FLOPs approximation, for ``--hidden --kv-hidden --layers``.

Skrull's ``layers * (20 h^2 S + 4 h h_kv S + 4 h S^2)`` needs only the hidden size, the key/value
width and the layer count. :data:`PRESETS` gives them for every bundled model (read from its
config: ``kv_hidden = kv_heads x head_dim``).
"""

from __future__ import annotations

from dataclasses import dataclass

from varpack.plan.models.presets import PRESET_CONFIGS, preset_spec


@dataclass(frozen=True)
class ModelDims:
    """Transformer dimensions used by the FLOPs model (kv_hidden = kv heads x head dim)."""

    hidden: int
    kv_hidden: int
    layers: int


def _dims(name: str) -> ModelDims:
    spec = preset_spec(name)
    return ModelDims(hidden=spec.hidden, kv_hidden=spec.kv_dim, layers=spec.layers)


#: preset name -> its Skrull dimensions
PRESETS: dict[str, ModelDims] = {name: _dims(name) for name in PRESET_CONFIGS}
