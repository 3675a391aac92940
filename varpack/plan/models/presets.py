"""Bundled configs of real models, the names ``--model-preset`` takes.

Each preset is the Hugging Face repository it comes from and the fields of that repository's
published ``config.json`` which the FLOPs model reads, copied from it (the other fields, rope,
norms, token ids, do no matmul), plus ``tie_word_embeddings`` for the parameter count the
tests check against each model's advertised size. A field left out here takes transformers'
default, as it would in the full file (Gemma-2's alternating windows, Gemma-3's pattern of 6).
"""

from __future__ import annotations

from typing import Any

from varpack.errors import ConfigError
from varpack.plan.models.hf_config import spec_from_config
from varpack.plan.models.spec import ModelSpec

_QWEN25 = {"model_type": "qwen2", "vocab_size": 151936, "use_sliding_window": False}
_LLAMA3 = {"model_type": "llama", "vocab_size": 128256, "tie_word_embeddings": False}
_MISTRAL = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
            "tie_word_embeddings": False}  # fmt: skip

#: name -> (Hugging Face repo id, the used fields of its config.json, copied from it)
PRESET_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B", {
        **_QWEN25, "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
        "num_key_value_heads": 2, "num_hidden_layers": 24, "tie_word_embeddings": True}),
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", {
        **_QWEN25, "hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
        "num_key_value_heads": 2, "num_hidden_layers": 28, "tie_word_embeddings": True}),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", {
        **_QWEN25, "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
        "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
        "tie_word_embeddings": False}),
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B", {
        **_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32}),
    "llama-3-70b": ("meta-llama/Meta-Llama-3-70B", {
        **_LLAMA3, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
        "num_key_value_heads": 8, "num_hidden_layers": 80}),
    "mistral-7b-v0.1": ("mistralai/Mistral-7B-v0.1", {
        "model_type": "mistral", **_MISTRAL, "sliding_window": 4096}),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", {
        "model_type": "mixtral", **_MISTRAL, "sliding_window": None, "num_local_experts": 8,
        "num_experts_per_tok": 2}),
    "phi-3-mini-4k": ("microsoft/Phi-3-mini-4k-instruct", {
        "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
        "vocab_size": 32064, "sliding_window": 2047, "tie_word_embeddings": False}),
    "gemma-2-2b": ("google/gemma-2-2b", {
        "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "num_hidden_layers": 26, "vocab_size": 256000, "sliding_window": 4096,
        "tie_word_embeddings": True}),
    "gemma-3-1b": ("google/gemma-3-1b-pt", {
        "model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "num_hidden_layers": 26, "vocab_size": 262144, "sliding_window": 512,
        "sliding_window_pattern": 6, "tie_word_embeddings": True}),
    "qwen3-8b": ("Qwen/Qwen3-8B", {
        "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 36, "vocab_size": 151936, "use_sliding_window": False,
        "tie_word_embeddings": False}),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", {
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
        "use_sliding_window": False, "tie_word_embeddings": False}),
    "qwen1.5-moe-a2.7b": ("Qwen/Qwen1.5-MoE-A2.7B", {
        "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
        "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24,
        "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "vocab_size": 151936, "use_sliding_window": False,
        "tie_word_embeddings": False}),
}  # fmt: skip


def preset_key(name: str) -> str | None:
    """The preset's key for ``name`` (any case), or None."""
    key = str(name).lower()
    return key if key in PRESET_CONFIGS else None


def preset_spec(name: str) -> ModelSpec:
    """The spec of a bundled model; an unknown name is refused with the known ones."""
    key = preset_key(name)
    if key is None:
        raise ConfigError(
            f"--model-preset {name!r} is unknown; choose one of {', '.join(sorted(PRESET_CONFIGS))}"
        )
    repo, fields = PRESET_CONFIGS[key]
    return spec_from_config(fields, f"preset {key} ({repo})")
