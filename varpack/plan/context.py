"""Long-context options: context parallelism (``--cp``), the memory model and the time model.

:class:`ContextOptions` is the base of :class:`varpack.plan.config.PlanConfig` (its fields are
plan options like any other, kept here so the config module stays one screenful per concern):

* ``--cp N`` splits every micro-batch over a CP group of N ranks (:mod:`varpack.plan.cp.place`);
* the memory model gives the token capacity of one CP rank, the *bucket size* C (Skrull's
  BucketSize): ``--bucket-size C``, or ``--memory-per-token A --memory-fixed B
  --memory-capacity BYTES`` with activation bytes ``A * S + B`` (so ``C = (BYTES - B) // A``);
  a micro-batch then holds at most ``C * N`` tokens (the default ``--max-tokens``);
* ``--cost time`` turns FLOPs into seconds, ``a * flops + b`` (``--time-per-flop``,
  ``--time-fixed``), or with a model the four-term ``a_lin * linear + a_attn * attention + c *
  samples + b`` (``--time-per-linear-flop`` and the others, :data:`TIME_TERMS`), as fitted by
  ``varpack calibrate``; with ``a * flops + b``, ``--comm-bytes-per-s`` and
  ``--comm-latency`` price the K/V exchange of distributed samples.

Options of a feature that is not in use are left out of plan.json's config (:func:`unused`), so
plans made without them keep their bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from varpack.errors import ConfigError

_BIG = 2**62  # bytes of memory and similar: far beyond any device, inside int64


def option(
    default: Any,
    help: str,
    choices: tuple[str, ...] | None = None,
    bounds: tuple[int, int] | None = None,
) -> Any:
    """A config field: its default, one line of help, its choices or its integer bounds."""
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    if bounds is not None:
        meta["bounds"] = bounds
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ContextOptions:
    """Context-parallel, memory-model and time-model options (see the module docstring)."""

    cp: int = option(
        1,
        "context-parallel ranks per data-parallel rank: each micro-batch is placed over them",
        bounds=(1, 1 << 16),
    )
    cp_placement: str = option(
        "dacp",
        "--cp: dacp (samples whole on one CP rank where memory allows, balanced, rollback), "
        "round-robin (into the emptiest rank, rollback), distributed (every sample sharded)",
        ("dacp", "round-robin", "distributed"),
    )
    cp_batching: str = option(
        "gds",
        "--cp: gds (each step's samples balanced over DP ranks by FLOPs, long and short paired "
        "in micro-batches) or greedy (micro-batches as the order gives them)",
        ("gds", "greedy"),
    )
    bucket_size: int | None = option(
        None,
        "tokens one (CP) rank holds in memory (C); the micro-batch budget is C x cp",
        bounds=(1, 2**31 - 1),
    )
    memory_per_token: float | None = option(
        None, "activation bytes per token A of the memory model A*S + B (with --memory-capacity)"
    )
    memory_fixed: float | None = option(
        None, "fixed activation bytes B of the memory model A*S + B (default 0)"
    )
    memory_capacity: int | None = option(
        None,
        "bytes one rank may use for activations; bucket size = (capacity - B) // A",
        bounds=(1, _BIG),
    )
    time_per_flop: float | None = option(
        None, "--cost time: seconds per FLOP a of the time model a*flops + b (varpack calibrate)"
    )
    time_fixed: float | None = option(
        None, "--cost time: fixed seconds b per micro-batch of the time model (default 0)"
    )
    time_per_linear_flop: float | None = option(
        None, "--cost time, four-term model: seconds per linear (matmul) FLOP (varpack calibrate)"
    )
    time_per_attention_flop: float | None = option(
        None, "--cost time, four-term model: seconds per causal attention FLOP"
    )
    time_per_sequence: float | None = option(
        None, "--cost time, four-term model: seconds per sample (default 0)"
    )
    time_per_micro_batch: float | None = option(
        None, "--cost time, four-term model: seconds per micro-batch (default 0)"
    )
    comm_bytes_per_s: float | None = option(
        None, "--cp with --cost time: bytes per second of the K/V all-gather of a CP group"
    )
    comm_latency: float | None = option(
        None, "--cp with --cost time: fixed seconds of one K/V all-gather (default 0)"
    )

    def bucket(self) -> int | None:
        """Token capacity of one (CP) rank from the memory model, or None without one."""
        if self.bucket_size is not None:
            return self.bucket_size
        if self.memory_per_token is None:
            return None
        assert self.memory_capacity is not None
        room = (self.memory_capacity - (self.memory_fixed or 0.0)) // self.memory_per_token
        return int(min(room, 2**31 - 1))  # a bucket beyond int32 holds any sample

    def time_model(self) -> tuple[float, float] | None:
        """``(a, b)`` of ``--cost time``, else None."""
        if self.time_per_flop is None:
            return None
        return (float(self.time_per_flop), float(self.time_fixed or 0.0))

    def time_terms(self) -> tuple[float, float, float, float] | None:
        """``(a_lin, a_attn, c, b)`` of the four-term ``--cost time``, else None."""
        if self.time_per_linear_flop is None and self.time_per_attention_flop is None:
            return None
        return tuple(float(getattr(self, k) or 0.0) for k in TIME_TERMS)  # type: ignore[return-value]

    def _resolve_context(self) -> Any:
        """Check the long-context options; fill ``--max-tokens`` from the bucket (C x cp)."""
        cfg: Any = self
        _positive(cfg)
        _check_memory_model(cfg)
        _check_time_model(cfg)
        c = cfg.bucket()
        if c is not None and c < 1:
            raise ConfigError(
                f"the memory model leaves {c} tokens per rank (capacity - B) // A; "
                "raise --memory-capacity or lower --memory-per-token / --memory-fixed"
            )
        if cfg.cp > 1:
            _check_cp_combination(cfg)
            if c is None:
                raise ConfigError(
                    "--cp needs a memory model: --bucket-size C, or --memory-per-token A "
                    "--memory-capacity BYTES (tokens one CP rank holds)"
                )
        if c is None:
            return cfg
        budget = min(c * cfg.cp, 2**31 - 1)  # memory for more than a plan's int32 lengths
        if cfg.max_tokens is None and cfg.batching == "budget":
            return dataclasses.replace(cfg, max_tokens=budget)
        if cfg.max_tokens is not None and cfg.max_tokens > budget:
            raise ConfigError(
                f"--max-tokens {cfg.max_tokens} exceeds what memory holds (bucket {c} x cp "
                f"{cfg.cp} = {budget} tokens); lower it or leave it out"
            )
        return cfg


def _positive(cfg: Any) -> None:
    for name in ("memory_per_token", "memory_fixed", "time_per_flop", "time_fixed"):
        _number(name, getattr(cfg, name), zero_ok=name in ("memory_fixed", "time_fixed"))
    for name in TIME_TERMS:
        _number(name, getattr(cfg, name), zero_ok=True)
    _number("comm_bytes_per_s", cfg.comm_bytes_per_s, zero_ok=False)
    _number("comm_latency", cfg.comm_latency, zero_ok=True)
    if cfg.comm_bytes_per_s is not None and cfg.comm_bytes_per_s < 1:  # times would overflow
        raise ConfigError(
            f"--comm-bytes-per-s {cfg.comm_bytes_per_s!r}: must be at least 1 (bytes per second "
            "of the K/V all-gather)"
        )


#: The largest value a model coefficient may take: every product of one with the plan's FLOPs,
#: tokens or steps stays finite (a plan.json never holds inf or NaN), and no real model needs more.
LARGEST = 1e20


def _number(name: str, value: Any, zero_ok: bool) -> None:
    if value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if (
        not ok
        or value != value
        or abs(value) > LARGEST
        or value < 0
        or (value == 0 and not zero_ok)
    ):
        need = ">= 0" if zero_ok else "> 0"
        raise ConfigError(
            f"--{name.replace('_', '-')} {value!r}: must be a finite number {need} and at most "
            f"{LARGEST:g}"
        )


def _check_memory_model(cfg: Any) -> None:
    model = cfg.memory_per_token is not None or cfg.memory_capacity is not None
    if cfg.memory_fixed is not None and not model:
        raise ConfigError("--memory-fixed needs --memory-per-token and --memory-capacity")
    if not model:
        return
    if cfg.memory_per_token is None or cfg.memory_capacity is None:
        raise ConfigError(
            "the memory model needs both --memory-per-token A and --memory-capacity BYTES"
        )
    if cfg.bucket_size is not None:
        raise ConfigError(
            "--bucket-size conflicts with the memory model (--memory-*); give one of them"
        )


#: the four-term time model's options: seconds per linear FLOP, per attention FLOP, per
#: sample, per micro-batch (:mod:`varpack.plan.timefit`)
TIME_TERMS = ("time_per_linear_flop", "time_per_attention_flop", "time_per_sequence",
              "time_per_micro_batch")  # fmt: skip


def _check_time_model(cfg: Any) -> None:
    terms = [k for k in TIME_TERMS if getattr(cfg, k) is not None]
    line = cfg.time_per_flop is not None or cfg.time_fixed is not None
    if cfg.cost != "time" and (line or terms):
        what = f"--{_flag(terms[0])}" if terms else "--time-per-flop / --time-fixed"
        raise ConfigError(f"{what} is used by --cost time only; add it or remove it")
    if terms and line:
        raise ConfigError(
            f"--{_flag(terms[0])} (the four-term time model) conflicts with --time-per-flop / "
            "--time-fixed (a * flops + b); give one model"
        )
    if terms:
        if cfg.time_per_linear_flop is None or cfg.time_per_attention_flop is None:
            raise ConfigError(
                "the four-term time model needs both --time-per-linear-flop and "
                "--time-per-attention-flop (varpack calibrate fits them)"
            )
        if cfg.time_per_linear_flop == 0 and cfg.time_per_attention_flop == 0:
            raise ConfigError(
                "--time-per-linear-flop and --time-per-attention-flop are both 0: the time "
                "would not grow with the work; give the fitted values"
            )
        if cfg.cp > 1:
            raise ConfigError(
                f"--cp {cfg.cp} conflicts with the four-term time model (--{_flag(terms[0])}): "
                "context parallelism prices with --time-per-flop / --time-fixed"
            )
    elif cfg.cost == "time" and cfg.time_per_flop is None:
        raise ConfigError(
            "--cost time needs --time-per-flop (and --time-fixed), or the four-term model "
            "(--time-per-linear-flop, --time-per-attention-flop, ...); fit them with varpack calibrate"
        )
    comm = cfg.comm_bytes_per_s is not None or cfg.comm_latency is not None
    if comm and (cfg.cost != "time" or cfg.cp < 2):
        raise ConfigError(
            "--comm-bytes-per-s / --comm-latency price the K/V exchange of --cp > 1 with "
            "--cost time; add both or remove them"
        )
    if cfg.comm_latency is not None and cfg.comm_bytes_per_s is None:
        raise ConfigError("--comm-latency needs --comm-bytes-per-s")


def check_terms_model(cfg: Any) -> None:
    """The four-term time model needs the model's FLOPs split (a spec, not Skrull's dimensions)."""
    if cfg.cost == "time" and cfg.time_terms() is not None and cfg.model is None:
        raise ConfigError(
            "the four-term time model (--time-per-linear-flop ...) needs the model: --model "
            "CONFIG or --model-preset NAME, not --hidden --kv-hidden --layers"
        )


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _check_cp_combination(cfg: Any) -> None:
    bad = [
        flag
        for flag, on in (
            ("--layout padded", cfg.layout != "packed"),
            ("--batching fixed/blocks", cfg.batching != "budget"),
            ("--pp", cfg.pp > 1),
            ("--max-shapes", cfg.max_shapes is not None),
            ("--pack-to", cfg.pack_to is not None),
            ("--oversize alone", cfg.oversize == "alone"),
        )
        if on
    ]
    if bad:
        raise ConfigError(
            f"--cp {cfg.cp} conflicts with {bad[0]}: context parallelism plans packed "
            "micro-batches of a token budget; remove one of them"
        )


def unused(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` without the long-context options left at their defaults (plan.json's config).

    >>> sorted(unused({"cp": 1, "cp_placement": "dacp", "dp": 2}))
    ['dp']
    """
    defaults = {f.name: f.default for f in dataclasses.fields(ContextOptions)}
    return {k: v for k, v in values.items() if k not in defaults or v != defaults[k]}


#: the long-context options and the model's, optional in plan.json's config
OPTIONAL_KEYS = frozenset(f.name for f in dataclasses.fields(ContextOptions)) | {
    "model",
    "model_digest",
}
