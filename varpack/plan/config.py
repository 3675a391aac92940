"""Every planning option in one frozen dataclass: its default, its help, its validation.

The CLI, a ``plan.toml`` file and the Python API all end in :class:`PlanConfig`; ``plan.json``
stores :meth:`PlanConfig.to_dict` of the *resolved* config (defaults filled in, the model's spec
and digest recorded), and ``validate`` rebuilds the config from there with :meth:`PlanConfig.from_mapping`. The
help of each option sits with its field (``metadata["help"]``, and ``metadata["choices"]`` for the
options chosen by name); the CLI builds its flags from the fields and their annotations.
Strategies named here are looked up in the registries of the stages (orders, cost models, LR
scalings, batchers); a test ties :data:`CHOICES` to those registries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from varpack.errors import ConfigError
from varpack.plan.context import ContextOptions, check_terms_model, option, unused
from varpack.plan.cost import CostModel
from varpack.plan.kernels.micro import MicroRule
from varpack.plan.kernels.pack import PackRule
from varpack.plan.model_choice import as_spec, resolve_model
from varpack.plan.models import PRESET_CONFIGS, ModelDims, ModelSpec
from varpack.plan.oversize import resolve_oversize
from varpack.plan.sync import resolve_sync

#: Largest length, budget or count a manifest can hold (its int32 columns).
INT32_MAX = 2**31 - 1
#: Bound of counts that multiply with lengths (token sums must stay well inside int64).
COUNT_MAX = 2**20


@dataclass(frozen=True)
class PlanConfig(ContextOptions):
    """All options of ``varpack plan``; build with :meth:`resolved`."""

    batching: str = option(
        "budget",
        "budget: as many samples as fit --max-tokens; fixed: --batch-size samples; "
        "blocks: whole samples packed into rows of --block-len (BLoad)",
        ("budget", "fixed", "blocks"),
    )
    max_tokens: int | None = option(
        None,
        "token budget of one micro-batch (padded tokens: B x T padded, or the packed total); "
        "required with --batching budget",
        bounds=(1, INT32_MAX),
    )
    batch_size: int | None = option(
        None, "samples per micro-batch; required with --batching fixed", bounds=(1, INT32_MAX)
    )
    layout: str = option(
        "packed",
        "packed: one flattened row per micro-batch; padded: B rows padded to the longest",
        ("packed", "padded"),
    )
    pad_multiple: int = option(
        1,
        "round the padded length (padded) or the packed total (packed) up to this multiple",
        bounds=(1, INT32_MAX),
    )
    oversize: str = option(
        "error",
        "a sample longer than the budget: error; drop it (listed in plan.json); alone (a "
        "micro-batch of its own); split it into pieces of --split-len tokens. error is the "
        "default because a split cuts an SFT sample from its prompt: varpack splits only when asked",
        ("error", "drop", "alone", "split"),
    )
    split_len: int | None = option(
        None, "--oversize split: longest piece (default: fits alone)", bounds=(1, INT32_MAX)
    )
    split_positions: str = option(
        "restart", "--oversize split: positions restart at 0, or continue", ("restart", "continue")
    )
    max_alone_tokens: int | None = option(
        None, "--oversize alone: bound (default 4 x --max-tokens)", bounds=(1, 2**62)
    )
    dp: int = option(1, "data-parallel ranks (one manifest each)", bounds=(1, COUNT_MAX))
    grad_accum: int = option(1, "micro-batches per rank per optimizer step", bounds=(1, COUNT_MAX))
    sync: str | None = option(
        None,
        "what ranks wait on: micro (FSDP, ZeRO-3: every micro-batch, so each slot is balanced "
        "across ranks) or step (DDP with no_sync, Megatron DP, pipelines: once per optimizer "
        "step, so each rank's step sum is); default micro, step with --pp",
        ("micro", "step"),
    )
    cost: str = option(
        "tokens",
        "cost model used to balance ranks and to score the plan",
        ("tokens", "padded", "flops", "time"),
    )
    model_preset: str | None = option(
        None, f"a bundled model for --cost flops/time: {', '.join(sorted(PRESET_CONFIGS))}"
    )
    hidden: int | None = option(
        None, "hidden size h of Skrull's approximation (--cost flops)", bounds=(1, COUNT_MAX)
    )
    kv_hidden: int | None = option(
        None,
        "key/value hidden size (kv heads x head dim) of Skrull's approximation",
        bounds=(1, COUNT_MAX),
    )
    layers: int | None = option(
        None, "transformer layers of Skrull's approximation", bounds=(1, COUNT_MAX)
    )
    model: ModelSpec | None = option(
        None, "the model --cost flops/time prices: a Hugging Face config.json or its directory"
    )
    model_digest: str | None = option(None, "the sha256 of the model's fields (plan.json)")
    order: str = option(
        "curriculum",
        "curriculum: steps follow the sorted order; shuffle: random order, regrouped in windows",
        ("curriculum", "shuffle"),
    )
    seed: int = option(
        0, "seed of the shuffle (each epoch reseeded from (seed, epoch))", bounds=(0, 2**63 - 1)
    )
    epochs: int = option(
        1, "number of passes over the data (steps are numbered continuously)", bounds=(1, COUNT_MAX)
    )
    shuffle_window: int = option(
        8,
        "shuffle: regroup samples within windows of this many steps (1 = most random); "
        "curriculum (flops/time cost): order micro-batches by cost within such windows",
        bounds=(1, INT32_MAX),
    )
    compose: str = option(
        "cost",
        "shuffle: compose steps by cost (every rank of a step carries the same cost; budget "
        "batching, any layout, --pp), by the balance engine (engine: packed layout, no --pp "
        "or --mix; compared with cost) or by tokens (micro-batches filled to the budget)",
        ("cost", "engine", "tokens"),
    )
    balance_fill: float = option(
        0.75,
        "--compose cost: the budget fill a step keeps at least when it levels its ranks by "
        "giving a rank with a heavy sample lighter micro-batches (1 = never underfill)",
    )
    lr_scaling: str = option(
        "none",
        "LR factor per step from the realised global batch: none, linear (k) or sqrt (sqrt k)",
        ("none", "linear", "sqrt"),
    )
    base_batch_size: float | None = option(
        None, "reference global batch size for --lr-scaling (in --base-unit)"
    )
    base_unit: str = option(
        "samples",
        "unit of --base-batch-size and of the realised batch: samples or tokens",
        ("samples", "tokens"),
    )
    max_shapes: int | None = option(
        None,
        "at most K distinct shapes per rank (lengths chosen to minimise padding); "
        "padded: B = max-tokens // T, short micro-batches get empty pad_rows",
        bounds=(1, COUNT_MAX),
    )
    pack_to: int | None = option(
        None,
        "packed: pad every micro-batch to exactly L tokens (the budget is L)",
        bounds=(1, INT32_MAX),
    )
    warmup: str = option(
        "list",
        "list: record each rank's shapes; reorder: also move one micro-batch of every shape "
        "to the front of each rank, largest first (compile warm-up); none: same as list",
        ("list", "reorder", "none"),
    )
    pp: int = option(
        1,
        "pipeline-parallel stages: one shape per (step, rank); --grad-accum must be a multiple",
        bounds=(1, COUNT_MAX),
    )
    block_len: int | None = option(
        None,
        "--batching blocks: length T of a block (default: the longest sample)",
        bounds=(1, INT32_MAX),
    )
    blocks_per_batch: int | None = option(
        None,
        "--batching blocks: blocks per micro-batch (default: max-tokens // block-len)",
        bounds=(1, INT32_MAX),
    )
    block_window: int = option(
        8192,
        "--batching blocks: samples packed together by best fit (stream window)",
        bounds=(1, INT32_MAX),
    )

    @property
    def micro_per_step(self) -> int:
        """Micro-batches of one optimizer step over all ranks (dp x grad_accum)."""
        return self.dp * self.grad_accum

    def cost_model(self) -> CostModel:
        """The cost model the cost functions take: kind, layout and (flops) the model or its
        dimensions, and the longest sample a micro-batch holds."""
        if self.cost not in ("flops", "time"):
            return CostModel(self.cost, self.layout, None, self.time_model())
        if self.model is not None:
            span = self.max_tokens or self.block_len
            return CostModel(self.cost, self.layout, None, self.time_model(), self.model, span,
                             self.time_terms())  # fmt: skip
        assert self.hidden is not None and self.kv_hidden is not None and self.layers is not None
        dims = ModelDims(self.hidden, self.kv_hidden, self.layers)
        return CostModel(self.cost, self.layout, dims, self.time_model())

    def micro_rule(self) -> MicroRule:
        """What shapes and scores a micro-batch (layout, pad multiple, cost model, blocks)."""
        blocks = None
        if self.batching == "blocks":
            assert self.block_len is not None and self.blocks_per_batch is not None
            blocks = (self.block_len, self.blocks_per_batch)
        return MicroRule(self.layout, self.pad_multiple, self.cost_model(), blocks)

    def pack_rule(self) -> PackRule:
        """When a sample joins a micro-batch: the budget, or a sample count (fixed batching)."""
        if self.batching == "fixed":
            return PackRule(self.layout, self.pad_multiple, None, self.batch_size)
        return PackRule(self.layout, self.pad_multiple, self.max_tokens, None)

    def to_dict(self) -> dict[str, Any]:
        out = unused(dataclasses.asdict(self))  # long-context options only where used
        if self.model is None:  # the model only where there is one
            return {k: v for k, v in out.items() if k not in ("model", "model_digest")}
        return {**out, "model": self.model.to_dict()}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "config") -> PlanConfig:
        """Build from a mapping (TOML table, plan.json ``config``); keys may use ``-`` or ``_``.

        >>> PlanConfig.from_mapping({"max-tokens": 64, "dp": 2}).resolved().max_tokens
        64
        """
        known = {f.name for f in fields(cls)}
        clean: dict[str, Any] = {}
        for key, value in values.items():
            name = str(key).replace("-", "_")
            if name not in known:
                raise ConfigError(
                    f"{where}: unknown option '{key}' (known: {', '.join(sorted(known))})"
                )
            if name in clean:
                raise ConfigError(f"{where}: option '{key}' is given twice (as - and _); keep one")
            model = name == "model" and isinstance(value, Mapping)  # plan.json's spec
            clean[name] = as_spec(value, f"{where}: model") if model else value
        return cls(**clean)

    def resolved(self) -> PlanConfig:
        """Check every option and combination; fill the model's spec from the preset."""
        cfg = self
        for name, choices in CHOICES.items():
            value = getattr(cfg, name)
            if value not in choices and (value is not None or name != "sync"):
                raise ConfigError(f"--{_flag(name)} {value!r}: choose one of {', '.join(choices)}")
        for f in fields(cfg):
            if "bounds" in f.metadata:
                _check_bounds(f.name, getattr(cfg, f.name), f.metadata["bounds"])
        cfg = (
            cfg._resolve_shapes()
            ._resolve_context()
            ._resolve_batching()
            ._resolve_model()
            ._resolve_lr()
        )
        fill = resolve_oversize(cfg)  # the default split length, where it applies
        cfg = cfg if fill is None else dataclasses.replace(cfg, split_len=fill)
        # A step's samples or tokens, and their sums, must stay far inside int64.
        per_micro = cfg.max_tokens or cfg.batch_size or 1
        if cfg.micro_per_step * per_micro > 2**52:
            raise ConfigError(
                f"--dp {cfg.dp} x --grad-accum {cfg.grad_accum} x {per_micro} per micro-batch "
                "is beyond what a step's token count can hold; lower one of them"
            )
        return cfg

    @property
    def uses_pad_rows(self) -> bool:
        """Whether micro-batches carry empty rows (the manifest's ``pad_rows`` column)."""
        if self.batching == "blocks":
            return True
        return self.layout == "padded" and (self.max_shapes is not None or self.pp > 1)

    def _resolve_shapes(self) -> PlanConfig:
        cfg = dataclasses.replace(self, sync=resolve_sync(self.sync, self.pp))
        if cfg.grad_accum % cfg.pp:
            raise ConfigError(
                f"--grad-accum {cfg.grad_accum} must be a multiple of --pp {cfg.pp} "
                "(every step's micro-batches fill the pipeline evenly)"
            )
        if cfg.pack_to is not None:
            if cfg.max_shapes is not None:
                raise ConfigError(
                    "--pack-to conflicts with --max-shapes (it fixes one shape); give one"
                )
            if cfg.layout != "packed" or cfg.batching != "budget":
                raise ConfigError(
                    "--pack-to applies to --layout packed with --batching budget; "
                    "use --max-shapes for the padded layout"
                )
            if cfg.max_tokens is None:
                cfg = dataclasses.replace(cfg, max_tokens=cfg.pack_to)
            elif cfg.max_tokens != cfg.pack_to:
                raise ConfigError(
                    f"--pack-to {cfg.pack_to} conflicts with --max-tokens {cfg.max_tokens}: every "
                    "micro-batch is padded to L, so L is the budget; give one of them (or equal values)"
                )
        if cfg.batching != "blocks":
            for name in ("block_len", "blocks_per_batch"):
                if getattr(cfg, name) is not None:
                    raise ConfigError(f"--{_flag(name)} applies to --batching blocks only")
            return cfg
        if cfg.batch_size is not None:
            raise ConfigError(
                "--batch-size conflicts with --batching blocks; use --blocks-per-batch"
            )
        if cfg.max_tokens is None and cfg.blocks_per_batch is None:
            raise ConfigError(
                "--batching blocks needs --max-tokens (blocks per micro-batch = max-tokens // "
                "block-len) or --blocks-per-batch"
            )
        if cfg.block_len is not None and cfg.max_tokens is not None:
            per = cfg.blocks_per_batch or max(cfg.max_tokens // cfg.block_len, 1)
            if per * cfg.block_len > cfg.max_tokens:
                raise ConfigError(
                    f"--blocks-per-batch {per} x --block-len {cfg.block_len} exceeds --max-tokens "
                    f"{cfg.max_tokens}; lower one of them"
                )
        # A block is a row padded to T: blocks use the padded layout's shapes (B blocks x T).
        return dataclasses.replace(cfg, layout="padded")

    def with_block_len(self, longest: int) -> PlanConfig:
        """Fill the data-dependent block defaults (block length = the longest sample, BLoad)."""
        if self.batching != "blocks":
            return self
        t = (
            self.block_len
            if self.block_len is not None
            else round_up_int(longest, self.pad_multiple)
        )
        per = self.blocks_per_batch
        if per is None:
            assert self.max_tokens is not None
            per = self.max_tokens // t
            if per < 1:
                raise ConfigError(
                    f"--block-len {t} (the longest sample unless given) exceeds --max-tokens "
                    f"{self.max_tokens}; a micro-batch must hold one block: raise --max-tokens or "
                    "give --block-len"
                )
        return dataclasses.replace(self, block_len=t, blocks_per_batch=per).resolved()

    def _resolve_batching(self) -> PlanConfig:
        fill = self.balance_fill
        if isinstance(fill, bool) or not isinstance(fill, int | float) or not 0.0 <= fill <= 1.0:
            raise ConfigError(f"--balance-fill {fill!r}: must be a number in [0, 1]")
        if self.batching == "blocks":
            return self
        if self.batching == "budget":
            if self.batch_size is not None:
                raise ConfigError(
                    "--batch-size conflicts with --batching budget; use --max-tokens, or --batching fixed"
                )
            if self.max_tokens is None:
                raise ConfigError(
                    "--batching budget needs --max-tokens (the token budget of a micro-batch)"
                )
            if self.max_tokens < self.pad_multiple:
                raise ConfigError(
                    f"--max-tokens {self.max_tokens} is smaller than --pad-multiple {self.pad_multiple}: nothing fits"
                )
        else:
            if self.max_tokens is not None:
                raise ConfigError(
                    "--max-tokens conflicts with --batching fixed; use --batch-size, or --batching budget"
                )
            if self.batch_size is None:
                raise ConfigError("--batching fixed needs --batch-size (samples per micro-batch)")
            if self.oversize != "error":
                raise ConfigError(
                    "--oversize applies to --batching budget only (fixed batches have no budget)"
                )
        return self

    def _resolve_model(self) -> PlanConfig:
        cfg: PlanConfig = resolve_model(self)  # the model's spec and digest (model_choice.py)
        check_terms_model(cfg)
        return cfg

    def _resolve_lr(self) -> PlanConfig:
        if self.lr_scaling == "none":
            if self.base_batch_size is not None:
                raise ConfigError(
                    "--base-batch-size has no effect with --lr-scaling none; add --lr-scaling linear|sqrt"
                )
            return self
        if self.base_batch_size is None:
            raise ConfigError(
                f"--lr-scaling {self.lr_scaling} needs --base-batch-size (the reference global batch)"
            )
        base = self.base_batch_size
        if (
            isinstance(base, bool)
            or not isinstance(base, int | float)
            or not base > 0
            or base == float("inf")
        ):
            raise ConfigError(f"--base-batch-size {base!r}: must be a number > 0")
        return dataclasses.replace(self, base_batch_size=float(base))


def round_up_int(x: int, m: int) -> int:
    return -(-x // m) * m


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _check_bounds(name: str, value: Any, bounds: tuple[int, int]) -> None:
    """An integer option within its bounds (``None`` means unset and passes)."""
    if value is None:
        return
    lo, hi = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"--{_flag(name)} {value!r}: must be an integer in [{lo}, {hi}]")


#: option name -> the names it may take (each is a key of its stage's registry)
CHOICES: dict[str, tuple[str, ...]] = {
    f.name: f.metadata["choices"] for f in fields(PlanConfig) if "choices" in f.metadata
}
