"""Model specs from config.json dicts: presets against their models' published sizes, refusals in
one line naming the field, unknown model types, the spec's digest, the crossover length."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from varpack.errors import ConfigError
from varpack.plan.cost import sample_flops
from varpack.plan.models import (
    PRESET_CONFIGS,
    PRESETS,
    ModelDims,
    ModelSpec,
    preset_spec,
    spec_from_config,
    unknown_note,
)
from varpack.plan.models.flops import crossover, linear_per_token, train_flops

#: preset -> (parameters, of which active per token), as each model's card states them
ADVERTISED = {
    "qwen2.5-0.5b": (0.49e9, None),
    "qwen2.5-1.5b": (1.54e9, None),
    "qwen2.5-7b": (7.61e9, None),
    "llama-3-8b": (8.03e9, None),
    "llama-3-70b": (70.6e9, None),
    "mistral-7b-v0.1": (7.24e9, None),
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "phi-3-mini-4k": (3.82e9, None),
    "gemma-2-2b": (2.61e9, None),
    "gemma-3-1b": (1.0e9, None),
    "qwen3-8b": (8.2e9, None),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9),
}

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
         "vocab_size": 100}  # fmt: skip


def _params(spec: ModelSpec, tied: bool, experts: int) -> int:
    """Weights of the matmuls with ``experts`` experts in each sparse layer, plus the embedding
    (norms and biases are a rounding error)."""
    h = spec.hidden
    attention = 2 * h * spec.q_dim + 2 * h * spec.kv_dim
    dense = 3 * h * spec.intermediate
    sparse = h * spec.experts + experts * 3 * h * spec.expert_intermediate
    sparse += 3 * h * spec.shared_intermediate + (h if spec.shared_gate else 0)
    n = len(spec.moe_layers)
    blocks = spec.layers * attention + (spec.layers - n) * dense + n * sparse
    return blocks + spec.vocab * h * (1 if tied else 2)


@pytest.mark.parametrize("name", sorted(PRESET_CONFIGS))
def test_presets_have_their_models_sizes(name: str) -> None:
    total, active = ADVERTISED[name]
    spec = preset_spec(name)
    tied = PRESET_CONFIGS[name][1]["tie_word_embeddings"]
    assert _params(spec, tied, spec.experts) == pytest.approx(total, rel=0.01)
    if active is not None:
        assert _params(spec, tied, spec.experts_per_token) == pytest.approx(active, rel=0.025)
    # every weight a token passes through is one multiply-add: linear FLOPs = 2 x those weights,
    # the LM head's included (counted untied), the input embedding's lookup not
    through = _params(spec, False, spec.experts_per_token) - spec.vocab * spec.hidden
    assert linear_per_token(spec) == 2 * through


def test_the_dimensions_of_the_old_presets_keep_their_values() -> None:
    assert {k: PRESETS[k] for k in ("qwen2.5-0.5b", "qwen2.5-7b", "llama-3-8b")} == {
        "qwen2.5-0.5b": ModelDims(896, 128, 24),
        "qwen2.5-7b": ModelDims(3584, 512, 28),
        "llama-3-8b": ModelDims(4096, 1024, 32),
    }
    assert PRESETS["qwen2.5-1.5b"] == ModelDims(1536, 256, 28)
    assert PRESETS["llama-3-70b"] == ModelDims(8192, 1024, 80)


def test_qwen_small_against_the_formula_it_replaces() -> None:
    """Qwen2.5-0.5B: a 32 K sample costs 74 x a 1 K one (Skrull's formula says 212 x); attention
    overtakes the linear layers at 23 K tokens; its LM head costs as much as 9 of its 24 layers."""
    spec = preset_spec("qwen2.5-0.5b")
    f = train_flops(np.array([1024, 32768]), spec)
    assert f.total[1] / f.total[0] == pytest.approx(74.3, abs=0.1)
    assert f.total[0] == pytest.approx(3.17e12, rel=0.01)
    assert crossover(spec) == 22970
    assert crossover(preset_spec("qwen2.5-7b")) == 70454
    old = sample_flops(np.array([1024, 32768]), PRESETS["qwen2.5-0.5b"])
    assert old[1] / old[0] == pytest.approx(212, abs=1)
    head = 2 * spec.hidden * spec.vocab
    assert 9 <= head / ((linear_per_token(spec) - head) / spec.layers) < 9.2


def test_crossover_by_window_structure() -> None:
    full = spec_from_config(LLAMA)
    lin, per = linear_per_token(full), 2 * full.q_dim * full.layers  # attention: per (S + 1) S
    assert crossover(full) == -(-lin // per) - 1
    sliding = spec_from_config({**LLAMA, "model_type": "mistral", "sliding_window": 64})
    assert crossover(sliding) is None  # attention per token stays below 4 q_dim L w
    wide = spec_from_config({**LLAMA, "model_type": "mistral", "sliding_window": 4096})
    assert crossover(wide) == crossover(full)  # reached before the window
    assert preset_spec("mistral-7b-v0.1").windows == (4096,) * 32
    assert crossover(preset_spec("mistral-7b-v0.1")) is None
    gemma = preset_spec("gemma-2-2b")
    assert gemma.windows == (4096, None) * 13
    assert gemma.windows.count(None) == 13 and crossover(gemma) is not None


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**LLAMA, "hidden_size": None}, "no hidden_size"),
        ({k: v for k, v in LLAMA.items() if k != "vocab_size"}, "no vocab_size"),
        ({k: v for k, v in LLAMA.items() if k != "intermediate_size"}, "no intermediate_size"),
        ({k: v for k, v in LLAMA.items() if k != "num_hidden_layers"}, "no num_hidden_layers"),
        ({k: v for k, v in LLAMA.items() if k != "num_attention_heads"}, "no num_attention_heads"),
        ({k: v for k, v in LLAMA.items() if k != "model_type"}, "no model_type"),
        ({**LLAMA, "model_type": "mixtral"}, "no num_local_experts"),
        ({**LLAMA, "model_type": "mixtral", "num_local_experts": 4}, "no num_experts_per_tok"),
        ({**LLAMA, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2},
         "no moe_intermediate_size"),
        ({**LLAMA, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 8}, "no shared_expert_intermediate_size"),
        ({**LLAMA, "num_key_value_heads": 3}, "num_key_value_heads 3 does not divide"),
        ({**LLAMA, "hidden_size": "64"}, "hidden_size is '64'; must be an integer >= 1"),
        ({**LLAMA, "vocab_size": True}, "vocab_size is True"),
        ({**LLAMA, "num_hidden_layers": 0}, "num_hidden_layers is 0"),
        ({**LLAMA, "head_dim": 2.5}, "head_dim is 2.5"),
        ({**LLAMA, "model_type": "mistral", "sliding_window": -1}, "sliding_window is -1"),
        ({**LLAMA, "model_type": "gemma2", "layer_types": ["full_attention"]},
         "layer_types has 1 entries for 2 layers"),
        ({**LLAMA, "model_type": "gemma2", "layer_types": ["full_attention", "chunked_attention"]},
         "layer_types[1] is 'chunked_attention'"),
        ({**LLAMA, "model_type": "qwen2", "use_sliding_window": "yes"}, "use_sliding_window is"),
        ({**LLAMA, "model_type": "gemma3_text", "use_bidirectional_attention": True},
         "causal attention only"),
        ({**LLAMA, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3},
         "num_experts_per_tok 3 exceeds the 2 experts"),
        ({**LLAMA, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 8, "mlp_only_layers": ["a"]}, "mlp_only_layers is ['a']"),
        (["not", "a", "dict"], "not a JSON object"),
    ],
)  # fmt: skip
def test_a_config_it_cannot_cost_is_refused_in_one_line(config: Any, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        spec_from_config(config, "path/config.json")
    text = str(err.value)
    assert text.startswith("path/config.json: ") and field in text and "\n" not in text


def test_defaults_of_the_families() -> None:
    bare = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    spec = spec_from_config(bare)
    assert (spec.kv_heads, spec.head_dim, spec.windows) == (4, 16, (None, None))
    mistral = {**bare, "model_type": "mistral", "num_attention_heads": 16}
    assert spec_from_config(mistral).kv_heads == 8  # its constant, as transformers has it
    assert (
        spec_from_config({**LLAMA, "model_type": "qwen3", "num_key_value_heads": 2}).head_dim == 128
    )
    gemma = spec_from_config({**LLAMA, "model_type": "gemma2", "num_key_value_heads": 4})
    assert gemma.head_dim == 256 and gemma.windows == (4096, None)
    g3 = spec_from_config({**LLAMA, "model_type": "gemma3_text", "num_key_value_heads": 4,
                           "num_hidden_layers": 7})  # fmt: skip
    assert g3.windows == (4096,) * 5 + (None, 4096)
    qwen = {**LLAMA, "model_type": "qwen2", "num_key_value_heads": 2, "sliding_window": 8,
            "max_window_layers": 1}  # fmt: skip
    assert spec_from_config(qwen).windows == (None, None)  # no use_sliding_window
    assert spec_from_config({**qwen, "use_sliding_window": True}).windows == (None, 8)
    moe = {**qwen, "model_type": "qwen2_moe", "use_sliding_window": True, "num_hidden_layers": 4,
           "max_window_layers": 3, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 8, "shared_expert_intermediate_size": 0,
           "decoder_sparse_step": 2, "mlp_only_layers": [3]}  # fmt: skip
    spec = spec_from_config(moe)
    assert spec.windows == (8, None, 8, None) and spec.moe_layers == (1,)
    assert spec.shared_gate and spec.intermediate == 96


def test_an_unknown_model_type_is_costed_with_a_note() -> None:
    spec = spec_from_config({**LLAMA, "model_type": "newformer", "sliding_window": 16})
    assert spec.windows == (16, 16) and spec.gated
    note = unknown_note(spec, "cfg.json")
    assert note is not None and "'newformer' is not one varpack knows" in note and "\n" not in note
    assert unknown_note(spec_from_config(LLAMA)) is None
    moe = spec_from_config({**LLAMA, "model_type": "newmoe", "num_experts": 4,
                            "num_experts_per_tok": 1, "moe_intermediate_size": 8})  # fmt: skip
    assert moe.moe_layers == (0, 1) and moe.intermediate == 0


def test_spec_round_trip_and_digest() -> None:
    spec = preset_spec("qwen1.5-moe-a2.7b")
    assert ModelSpec.from_dict(spec.to_dict()) == spec and hash(spec) == hash(
        ModelSpec.from_dict(spec.to_dict())
    )
    assert spec.digest() == ModelSpec.from_dict(spec.to_dict()).digest()
    assert spec.digest() != preset_spec("qwen3-30b-a3b").digest()
    assert spec.digest().startswith("sha256:") and len(spec.digest()) == 7 + 64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden": 0}, "hidden must be a positive integer"),
        ({"windows": [None]}, "one window per layer"),
        ({"windows": "full"}, "windows must be a list"),
        ({"moe_layers": [0, 0]}, "increasing"),
        ({"moe_layers": [99]}, "moe_layers must list layers"),
        ({"gated": 1}, "gated must be true or false"),
        ({"colour": 1}, "unknown field 'colour'"),
        ({"kv_heads": 3}, "does not divide"),
    ],
)
def test_a_bad_recorded_spec_is_refused(change: dict[str, Any], message: str) -> None:
    values = {**preset_spec("qwen2.5-0.5b").to_dict(), **change}
    with pytest.raises(ConfigError, match=message):
        ModelSpec.from_dict(values, "plan.json config.model")
    values = preset_spec("qwen2.5-0.5b").to_dict()
    del values["vocab"]
    with pytest.raises(ConfigError, match="no 'vocab' field"):
        ModelSpec.from_dict(values)


def test_presets_are_found_by_any_case() -> None:
    assert preset_spec("Qwen2.5-0.5B") == preset_spec("qwen2.5-0.5b")
    with pytest.raises(ConfigError, match="unknown; choose one of .*qwen3-8b"):
        preset_spec("gpt-9")
