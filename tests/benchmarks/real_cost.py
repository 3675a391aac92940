"""An independent cost of a real model's training on each sample, to score plans with.

Written here from the model's ``config.json`` fields and the causal attention rule, without
varpack's own cost code (``varpack.plan.models``, ``varpack.plan.cost``), so that a plan balanced
by the planner is read by a second count of the same FLOPs. For ``S`` tokens run alone, training
(forward and backward, 3 forwards) costs

    sum over layers l of 3 * (S * linear_l + 4 * q_dim * sum_{i=1..S} min(i, w_l))

plus ``3 * S * 2 * hidden * vocab`` for the LM head, where ``linear_l`` is the forward matmul
FLOPs of one token in layer ``l`` (q, k, v, o projections; the gated MLP's three matmuls, or the
router and the experts each token visits) and ``w_l`` the layer's window (``S`` for full
attention). The key sums are read from a table ``cumsum(minimum(arange(1, n + 1), w))`` (not a
closed form). A packed micro-batch costs its samples' sum plus ``3 x linear`` per pad token; a
padded one, each row as a sample of its padded length.

:func:`load` reads a preset's name (the fields ``varpack.plan.models.presets`` copies from the
model's config.json: data, not cost code) or a config.json (or its directory). Fields follow
transformers: ``layer_types`` where given; else mistral, mixtral and phi3 slide on every layer
(``sliding_window``, null: none), qwen2 and qwen3 from ``max_window_layers`` (default 28) on
with ``use_sliding_window``, gemma2 on the even layers, gemma3_text on all but every
``sliding_window_pattern``-th (6); llama never. A config the scorer cannot read stops the
benchmark with a line naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DENSE = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text"}
MOE = {"mixtral", "qwen2_moe", "qwen3_moe"}
HEAD_DIM = {"qwen3": 128, "qwen3_moe": 128, "gemma2": 256, "gemma3_text": 256}


def load(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """``(name, config fields)`` of a preset name or a config.json path (or its directory)."""
    from varpack.plan.models.presets import PRESET_CONFIGS

    key = name_or_path.lower()
    if key in PRESET_CONFIGS:
        return key, dict(PRESET_CONFIGS[key][1])
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise SystemExit(
            f"--model {name_or_path!r}: neither a preset ({', '.join(sorted(PRESET_CONFIGS))}) "
            "nor a config.json"
        )
    return path.parent.name or path.stem, json.loads(path.read_text())


def _need(c: dict[str, Any], key: str) -> int:
    if c.get(key) is None:
        raise SystemExit(f"config {c.get('model_type')!r}: no {key}; the scorer needs it")
    return int(c[key])


def _windows(c: dict[str, Any], layers: int) -> list[int | None]:
    t = c["model_type"]
    w = c.get("sliding_window", 4096 if t in ("mistral", "gemma2", "gemma3_text") else None)
    if c.get("layer_types") is not None:
        return [w if x == "sliding_attention" else None for x in c["layer_types"]]
    if t in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not c.get("use_sliding_window", False):
            return [None] * layers
        start = c.get("max_window_layers", 28)
        if t == "qwen2_moe":
            return [w if i % 2 == 0 and i < start else None for i in range(layers)]
        if t == "qwen3_moe":
            return [w] * layers
        return [w if i >= start else None for i in range(layers)]
    if t == "gemma2":
        return [w if i % 2 == 0 else None for i in range(layers)]
    if t == "gemma3_text":
        every = c.get("sliding_window_pattern", 6)
        return [w if (i + 1) % every else None for i in range(layers)]
    if t == "llama":
        return [None] * layers
    return [w or None] * layers  # mistral, mixtral, phi3


@dataclass(frozen=True)
class RealModel:
    """A model's per-layer forward matmul FLOPs of one token, windows and query width."""

    name: str
    layer_linear: tuple[float, ...]  # forward matmul FLOPs of one token, layer by layer
    head: float  # the LM head's forward FLOPs of one token
    q_dim: int
    windows: tuple[int | None, ...]
    hidden: int  # the three dimensions of the old formula (--hidden --kv-hidden --layers)
    kv_dim: int
    layers: int

    @classmethod
    def of(cls, name_or_path: str) -> RealModel:
        """The model of a preset's name or a config.json path (:func:`load`)."""
        return cls.of_config(*load(name_or_path))

    @classmethod
    def of_config(cls, name: str, c: dict[str, Any]) -> RealModel:
        """The model of a config.json's fields."""
        t = c.get("model_type")
        if t not in DENSE | MOE:
            raise SystemExit(
                f"config {name}: model_type {t!r}; the scorer reads {sorted(DENSE | MOE)}"
            )
        h, layers = _need(c, "hidden_size"), _need(c, "num_hidden_layers")
        heads = _need(c, "num_attention_heads")
        kv = int(c.get("num_key_value_heads") or heads)
        hd = int(c.get("head_dim") or HEAD_DIM.get(t, h // heads))
        q, k = heads * hd, kv * hd
        attn = 2.0 * h * q + 2 * 2.0 * h * k + 2.0 * q * h  # q; k and v; o
        per = []
        for i in range(layers):
            mlp = 3 * 2.0 * h * _need(c, "intermediate_size") if t in DENSE else 0.0
            if t == "mixtral":
                e = _need(c, "num_local_experts")
                mlp = 2.0 * h * e + _need(c, "num_experts_per_tok") * 3 * 2.0 * h * _need(
                    c, "intermediate_size"
                )
            elif t in MOE:
                step = c.get("decoder_sparse_step") or 1
                if i in (c.get("mlp_only_layers") or []) or (i + 1) % step:
                    mlp = 3 * 2.0 * h * _need(c, "intermediate_size")
                else:
                    mlp = 2.0 * h * _need(c, "num_experts") + _need(
                        c, "num_experts_per_tok"
                    ) * 3 * 2.0 * h * _need(c, "moe_intermediate_size")
                    if t == "qwen2_moe":  # the shared expert and its gate
                        mlp += 3 * 2.0 * h * _need(c, "shared_expert_intermediate_size") + 2.0 * h
            per.append(attn + mlp)
        head = 2.0 * h * _need(c, "vocab_size")
        return cls(name, tuple(per), head, q, tuple(_windows(c, layers)), h, k, layers)

    def describe(self) -> str:
        """One line: layers, hidden, query width, the windows."""
        slide = sorted({w for w in self.windows if w is not None})
        where = (
            f", window {slide[0]} on {sum(w is not None for w in self.windows)} of "
            f"{self.layers} layers"
            if slide
            else ", full attention"
        )
        return (
            f"{self.layers} layers, hidden {self.hidden}, q {self.q_dim}, kv {self.kv_dim}{where}"
        )

    @property
    def pad_cost(self) -> float:
        """Training FLOPs of one pad token of a packed row: its matmuls (3 forwards)."""
        return 3.0 * (sum(self.layer_linear) + self.head)

    def sample_cost(self, lens: np.ndarray) -> np.ndarray:
        """Training FLOPs of each sample alone (float64), summed layer by layer."""
        s = np.asarray(lens, dtype=np.int64)
        top = int(s.max(initial=1))
        pairs: dict[int | None, np.ndarray] = {}  # window -> sum_{i<=S} min(i, w) for S = 0..top
        out: np.ndarray = 3.0 * self.head * s.astype(np.float64)
        for lin, w in zip(self.layer_linear, self.windows, strict=True):
            if w not in pairs:
                i = np.arange(1, top + 1, dtype=np.int64)
                pairs[w] = np.concatenate([[0], np.cumsum(i if w is None else np.minimum(i, w))])
            out += 3.0 * (s * lin + 4.0 * self.q_dim * pairs[w][s])
        return out


def micro_costs(p: Any, model: RealModel) -> tuple[np.ndarray, float]:
    """Each micro-batch's cost under ``model`` and the samples' total cost (no padding)."""
    sl = p.lens[p.stream] if p.stream_lens is None else p.stream_lens
    own = model.sample_cost(sl)
    starts = np.asarray(p.offsets[:-1])
    real = np.add.reduceat(own, starts)
    pad_to = np.asarray(p.micro.pad_to, dtype=np.int64)
    if p.cfg.layout == "padded":
        rows = np.diff(np.asarray(p.offsets))
        cost = rows * model.sample_cost(pad_to)
    else:
        tokens = np.add.reduceat(sl.astype(np.int64), starts)
        cost = real + model.pad_cost * (pad_to - tokens)
    return cost, float(own.sum())


def times(p: Any, model: RealModel) -> dict[str, float]:
    """``{"step", "micro"}``: the plan's time over the ideal (samples' cost / dp) under each
    synchronisation: the sum over steps of the slowest rank's step sum; the sum over each
    step's micro-batch slots of the slowest rank in the slot."""
    cost, total = micro_costs(p, model)
    dp = p.cfg.dp
    step, rank, slot = np.asarray(p.step), np.asarray(p.rank), np.asarray(p.micro_index)
    steps, slots = int(step.max()) + 1, int(slot.max()) + 1
    by_rank = np.zeros((steps, dp))
    np.add.at(by_rank, (step, rank), cost)
    by_slot = np.zeros((steps, slots, dp))
    np.add.at(by_slot, (step, slot, rank), cost)
    ideal = total / dp
    return {
        "step": float(by_rank.max(axis=1).sum()) / ideal,
        "micro": float(by_slot.max(axis=2).sum()) / ideal,
    }
