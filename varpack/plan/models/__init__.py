"""Models the cost of a sample is computed for: their architecture and its FLOPs.

* :mod:`.spec`: :class:`ModelSpec`, the fields of a decoder the FLOPs depend on (frozen,
  hashable, with the digest a plan records);
* :mod:`.hf_config`: :func:`spec_from_config`, a spec from a Hugging Face ``config.json``
  (already parsed: reading the file is the caller's job), family by family as transformers
  builds the model;
* :mod:`.flops`: the linear and causal-attention FLOPs of one sample alone, per forward and for
  training (3 forwards);
* :mod:`.presets`: bundled configs of real models (``--model-preset``);
* :mod:`.dims`: :class:`ModelDims`, the three dimensions of Skrull's approximation.

Imports NumPy and ``varpack.errors`` only.
"""

from varpack.plan.models.dims import PRESETS, ModelDims
from varpack.plan.models.hf_config import FAMILIES, spec_from_config, unknown_note
from varpack.plan.models.presets import PRESET_CONFIGS, preset_key, preset_spec
from varpack.plan.models.spec import ModelSpec

__all__ = ["FAMILIES", "PRESETS", "PRESET_CONFIGS", "ModelDims", "ModelSpec", "preset_key",
           "preset_spec", "spec_from_config", "unknown_note"]  # fmt: skip
