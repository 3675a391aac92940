"""A :class:`ModelSpec` from a Hugging Face ``config.json`` (already read: a dict; no I/O here).

Each family is read as transformers 5 builds its model (``models/<family>/configuration_*.py``
and ``modeling_*.py``):

* the sizes (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``vocab_size``,
  the MLP's ``intermediate_size``, the experts' counts and widths) are required: a config
  without one is refused in one line naming the field;
* the structure fields default as transformers does when they are absent: key/value heads (the
  attention heads, or the family's constant), ``head_dim`` (hidden / heads, 128 for qwen3, 256
  for gemma), the sliding windows and which layers use them, which layers are sparse;
* sliding windows: mistral, mixtral, phi3 and qwen3_moe slide on every layer when
  ``sliding_window`` is set (qwen3_moe only with ``use_sliding_window``); qwen2 and qwen3 slide on
  the layers from ``max_window_layers`` on with ``use_sliding_window``; qwen2_moe on the even
  layers below ``max_window_layers``; gemma2 on the even layers, gemma3_text on all but every
  ``sliding_window_pattern``-th; ``layer_types``, where given, says it for each layer instead;
* experts: mixtral's every layer; qwen2_moe's and qwen3_moe's layers ``l`` with
  ``(l + 1) % decoder_sparse_step == 0`` outside ``mlp_only_layers``; qwen2_moe adds a shared
  expert and its gate.

A vision-language model (``qwen2_vl``, ``qwen2_5_vl``) is read as its language model, from its
``text_config`` (or the top level, as the configs on the Hub have it); its vision tower is
:func:`~varpack.plan.models.vision.vision_from_config`'s, and a config with a vision tower of
another type is refused.

A ``model_type`` outside :data:`FAMILIES` whose fields are all present is read as a Llama-style
decoder (gated MLP, ``layer_types`` or ``sliding_window`` for the windows, experts where it has
``num_experts``); :func:`unknown_note` gives the line that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from varpack.errors import ConfigError
from varpack.plan.models.fields import Fields
from varpack.plan.models.spec import ModelSpec
from varpack.plan.models.vision import VISION_TYPES, text_config, vision_from_config

Windows = tuple[int | None, ...]


@dataclass(frozen=True)
class _Family:
    """How transformers builds one family: its defaults and its rules for windows and experts."""

    kv_heads: int | None  # num_key_value_heads when absent (None: the attention heads)
    head_dim: int | None  # head_dim when absent (None: hidden // heads)
    windows: Callable[[Fields, int], Windows]
    experts: str | None = None  # how the sparse layers are read: mixtral, qwen2_moe, qwen3_moe


def _every_layer(default: int | None, switch: bool = False) -> Callable[[Fields, int], Windows]:
    """``sliding_window`` (``default`` when absent) on every layer; ``switch``: only with
    ``use_sliding_window``."""

    def windows(f: Fields, layers: int) -> Windows:
        w = f.value("sliding_window", default, zero=True) or None
        if switch and not f.flag("use_sliding_window", False):
            w = None
        return (w,) * layers

    return windows


def _by_type(
    default: Callable[[Fields, int, int | None], list[bool]],
    switch: bool = False,
    sw: int | None = 4096,
) -> Callable[[Fields, int], Windows]:
    """``sliding_window`` on the layers whose type is ``sliding_attention``: ``layer_types``
    where given, else the family's ``default`` pattern; ``switch``: the window only with
    ``use_sliding_window``."""

    def windows(f: Fields, layers: int) -> Windows:
        w = f.value("sliding_window", sw, zero=True) or None
        if switch and not f.flag("use_sliding_window", False):
            w = None
        types = f.layer_list("layer_types")
        if types is None:
            sliding = default(f, layers, w)
        else:
            sliding = _sliding_types(f, types, layers)
        return tuple(w if s else None for s in sliding)

    return windows


def _sliding_types(f: Fields, types: list[Any], layers: int) -> list[bool]:
    if len(types) != layers:
        raise f.fail(f"layer_types has {len(types)} entries for {layers} layers; give one a layer")
    out = []
    for i, t in enumerate(types):
        if t not in ("full_attention", "attention", "sliding_attention"):
            raise f.fail(
                f"layer_types[{i}] is {t!r}; varpack costs full_attention and "
                "sliding_attention layers only"
            )
        out.append(t == "sliding_attention")
    return out


def _from_max_window(f: Fields, layers: int, w: int | None) -> list[bool]:  # qwen2, qwen3
    start = f.value("max_window_layers", 28, zero=True)
    return [w is not None and start is not None and i >= start for i in range(layers)]


def _even_below_max_window(f: Fields, layers: int, w: int | None) -> list[bool]:  # qwen2_moe
    stop = f.value("max_window_layers", 28, zero=True) or 0
    return [w is not None and i % 2 == 0 and i < stop for i in range(layers)]


def _even(f: Fields, layers: int, w: int | None) -> list[bool]:  # gemma2
    return [i % 2 == 0 for i in range(layers)]


def _pattern(f: Fields, layers: int, w: int | None) -> list[bool]:  # gemma3_text
    every = f.value("sliding_window_pattern", 6) or 6
    return [(i + 1) % every != 0 for i in range(layers)]


def _no_windows(f: Fields, layers: int) -> Windows:
    return (None,) * layers


def _unknown_windows(f: Fields, layers: int) -> Windows:
    if f.config.get("layer_types") is not None:
        return _by_type(_even, sw=None)(f, layers)  # layer_types given: the pattern is unused
    return _every_layer(None)(f, layers) if f.flag("use_sliding_window", True) else (None,) * layers


#: model_type -> how transformers 5.24 builds it
FAMILIES: dict[str, _Family] = {
    "llama": _Family(None, None, _no_windows),
    "mistral": _Family(8, None, _every_layer(4096)),
    "mixtral": _Family(8, None, _every_layer(None), "mixtral"),
    "qwen2": _Family(32, None, _by_type(_from_max_window, switch=True)),
    "qwen2_moe": _Family(16, None, _by_type(_even_below_max_window, switch=True), "qwen2_moe"),
    "qwen3": _Family(32, 128, _by_type(_from_max_window, switch=True)),
    "qwen3_moe": _Family(4, None, _every_layer(4096, switch=True), "qwen3_moe"),
    "gemma2": _Family(4, 256, _by_type(_even)),
    "gemma3_text": _Family(4, 256, _by_type(_pattern)),
    "phi3": _Family(None, None, _every_layer(None)),
    # vision-language: the language model's fields (text_config), Qwen2's rules
    "qwen2_vl": _Family(32, None, _by_type(_from_max_window, switch=True)),
    "qwen2_5_vl": _Family(32, None, _by_type(_from_max_window, switch=True)),
}
_UNKNOWN = _Family(None, None, _unknown_windows, "unknown")


def spec_from_config(config: Mapping[str, Any], where: str = "config") -> ModelSpec:
    """The spec of the model transformers builds from ``config`` (a parsed config.json).

    >>> spec_from_config({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    ...     "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100}).kv_heads
    4
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: not a JSON object of a model's config")
    vision_from_config(config, where)  # a vision tower varpack does not cost is refused here
    if isinstance(config.get("text_config"), Mapping) and "model_type" in config:
        inner = f"{where}: text_config"
    else:
        inner = where
    config = text_config(config, where)
    f = Fields(config, inner if config.get("model_type") in VISION_TYPES else where)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise f.fail("no model_type; give a Hugging Face config.json (it names its model_type)")
    family = FAMILIES.get(model_type, _UNKNOWN)
    if model_type.startswith("gemma") and f.flag("use_bidirectional_attention", False):
        raise f.fail("use_bidirectional_attention is set; varpack costs causal attention only")
    hidden = f.size("hidden_size")
    layers = f.size("num_hidden_layers")
    heads = f.size("num_attention_heads")
    vocab = f.size("vocab_size")
    kv = f.value("num_key_value_heads", family.kv_heads)
    kv = heads if kv is None else kv
    if heads % kv:
        raise f.fail(f"num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    head_dim = f.value("head_dim", family.head_dim)
    head_dim = hidden // heads if head_dim is None else head_dim
    if head_dim < 1:
        raise f.fail(f"hidden_size {hidden} over num_attention_heads {heads} leaves no head_dim")
    experts = _experts(f, family.experts, layers)
    dense = layers - len(experts.get("moe_layers", ()))
    intermediate = f.size("intermediate_size") if dense else 0
    return ModelSpec(
        model_type=model_type, hidden=hidden, layers=layers, heads=heads, kv_heads=kv,
        head_dim=head_dim, intermediate=intermediate, gated=True, vocab=vocab,
        windows=family.windows(f, layers), **experts,
    )  # fmt: skip


def _experts(f: Fields, rule: str | None, layers: int) -> dict[str, Any]:
    """The mixture-of-experts fields of the spec (empty for a dense model)."""
    if rule is None:
        return {}
    if rule == "unknown" and all(
        f.config.get(k) is None for k in ("num_experts", "num_local_experts")
    ):
        return {}  # an unknown dense model
    shared, gate = 0, False
    if rule == "mixtral":
        n = f.size("num_local_experts", "num_experts")
        sparse = list(range(layers))
        width = f.size("intermediate_size")
    else:  # qwen2_moe, qwen3_moe, and an unknown type that names its experts
        n = f.size("num_experts", "num_local_experts", zero=True)
        if n == 0:
            return {}
        step = f.value("decoder_sparse_step", 1) or 1
        only = f.layer_list("mlp_only_layers") or []
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            raise f.fail(f"mlp_only_layers is {only!r}; must list layer numbers")
        sparse = [i for i in range(layers) if i not in only and (i + 1) % step == 0]
        width = f.size("moe_intermediate_size")
        gate = rule == "qwen2_moe"
        if gate or (rule == "unknown" and "shared_expert_intermediate_size" in f.config):
            shared = f.size("shared_expert_intermediate_size", zero=True)
    k = f.size("num_experts_per_tok")
    if k > n:
        raise f.fail(f"num_experts_per_tok {k} exceeds the {n} experts")
    if not sparse:
        return {}
    return dict(experts=n, experts_per_token=k, expert_intermediate=width,
                shared_intermediate=shared, shared_gate=gate, moe_layers=tuple(sparse))  # fmt: skip


def unknown_note(spec: ModelSpec, where: str = "config") -> str | None:
    """The line saying a model_type varpack does not know was costed by its fields, or None."""
    if spec.model_type in FAMILIES:
        return None
    return (
        f"{where}: model_type {spec.model_type!r} is not one varpack knows "
        f"({', '.join(sorted(FAMILIES))}); costed from its fields as a Llama-style decoder "
        "(q/k/v/o projections, gated MLP, LM head): check `varpack cost` against the model"
    )
