"""A model's architecture as the FLOPs model reads it: :class:`ModelSpec`.

The spec holds exactly the fields the FLOPs of a sample depend on, and nothing else (no norms,
no activations, no biases: they do no matmul). It is frozen and hashable; :meth:`ModelSpec.digest`
is the sha256 of its canonical JSON (:meth:`ModelSpec.to_dict`), so that a plan can record the
model it was balanced for and a reader can tell whether two plans were balanced for the same
one. :meth:`ModelSpec.from_dict` reads the dict back (from ``plan.json``), checking every field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from varpack.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """The fields of a decoder-only transformer that its matmul and attention FLOPs depend on.

    ``windows[l]`` is the attention window of layer ``l`` (``None``: every earlier key). The MLP
    of a layer listed in ``moe_layers`` is a mixture of experts: a router (hidden x experts),
    ``experts_per_token`` experts of width ``expert_intermediate``, and a shared expert of width
    ``shared_intermediate`` (0: none) with, where ``shared_gate``, its gate (hidden x 1). Every
    other layer has a dense MLP of width ``intermediate`` (0 when no layer is dense). ``gated``:
    the MLP has a gate projection beside its up projection (SwiGLU, GeGLU: three matmuls).
    """

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    gated: bool
    vocab: int
    windows: tuple[int | None, ...]
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    shared_gate: bool = False
    moe_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise ConfigError(f"model: {problem}")

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): kv heads x head_dim."""
        return self.kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (tuples as lists), in field order."""
        out = asdict(self)
        out["windows"] = list(self.windows)
        out["moe_layers"] = list(self.moe_layers)
        return out

    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON of :meth:`to_dict` (sorted keys, no spaces).

        >>> a = ModelSpec("llama", 8, 1, 2, 1, 4, 16, True, 10, (None,))
        >>> a.digest() == ModelSpec.from_dict(a.to_dict()).digest()
        True
        """
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "model") -> ModelSpec:
        """The spec from :meth:`to_dict`'s form; a missing, unknown or bad field is refused."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: must be a table of the model's fields, not {values!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(map(str, values)) - set(names))
        if unknown:
            raise ConfigError(f"{where}: unknown field '{unknown[0]}' (known: {', '.join(names)})")
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in values:
                if f.default is not MISSING:  # a field with a default
                    continue
                raise ConfigError(f"{where}: no '{f.name}' field; give every field of the model")
            value = values[f.name]
            if f.name in ("windows", "moe_layers"):
                if not isinstance(value, list | tuple):
                    raise ConfigError(f"{where}: {f.name} must be a list, not {value!r}")
                value = tuple(value)
            kw[f.name] = value
        try:
            return cls(**kw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {str(exc).removeprefix('model: ')}") from None

    def describe(self) -> str:
        """One line naming the architecture.

        >>> ModelSpec("llama", 64, 2, 4, 2, 16, 96, True, 100, (None, 8)).describe()
        'llama: 2 layers, hidden 64, 4 heads (2 kv) x 16, gated MLP 96, vocab 100, windows 8 on 1 of 2 layers'
        """
        parts = [
            f"{self.layers} layers",
            f"hidden {self.hidden}",
            f"{self.heads} heads ({self.kv_heads} kv) x {self.head_dim}",
        ]
        kind = "gated MLP" if self.gated else "MLP"
        dense = self.layers - len(self.moe_layers)
        if dense:
            parts.append(f"{kind} {self.intermediate}")
        if self.moe_layers:
            moe = f"{self.experts_per_token} of {self.experts} experts x {self.expert_intermediate}"
            if self.shared_intermediate:
                moe += f" + shared {self.shared_intermediate}"
            parts.append(moe + (f" on {len(self.moe_layers)} layers" if dense else ""))
        parts.append(f"vocab {self.vocab}")
        sliding = sorted({w for w in self.windows if w is not None})
        if sliding:
            n = sum(w is not None for w in self.windows)
            parts.append(f"windows {', '.join(map(str, sliding))} on {n} of {self.layers} layers")
        return f"{self.model_type}: " + ", ".join(parts)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _problem(s: ModelSpec) -> str | None:
    """What is wrong with a spec's fields, or None."""
    if not isinstance(s.model_type, str) or not s.model_type:
        return f"model_type must be a name, not {s.model_type!r}"
    for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "vocab"):
        if not _positive(getattr(s, name)):
            return f"{name} must be a positive integer, not {getattr(s, name)!r}"
    for name in ("intermediate", "experts", "experts_per_token", "expert_intermediate",
                 "shared_intermediate"):  # fmt: skip
        if not _count(getattr(s, name)):
            return f"{name} must be an integer >= 0, not {getattr(s, name)!r}"
    for name in ("gated", "shared_gate"):
        if not isinstance(getattr(s, name), bool):
            return f"{name} must be true or false, not {getattr(s, name)!r}"
    if s.heads % s.kv_heads:
        return f"kv_heads {s.kv_heads} does not divide heads {s.heads}"
    if not isinstance(s.windows, tuple) or len(s.windows) != s.layers:
        return f"windows must give one window per layer ({s.layers}), not {s.windows!r}"
    bad = [w for w in s.windows if w is not None and not _positive(w)]
    if bad:
        return f"a window must be a positive integer or null (full attention), not {bad[0]!r}"
    moe = s.moe_layers
    if not isinstance(moe, tuple) or not all(_count(i) and i < s.layers for i in moe):
        return f"moe_layers must list layers in [0, {s.layers}), not {moe!r}"
    if list(moe) != sorted(set(moe)):
        return f"moe_layers must be increasing, without repeats, not {list(moe)!r}"
    if moe and not (s.experts and s.experts_per_token and s.expert_intermediate):
        return "moe_layers need experts, experts_per_token and expert_intermediate above 0"
    if s.experts_per_token > s.experts:
        return f"experts_per_token {s.experts_per_token} exceeds experts {s.experts}"
    if len(moe) < s.layers and not s.intermediate:
        return "the layers outside moe_layers need their MLP's intermediate size above 0"
    return None
