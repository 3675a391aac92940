"""``plan_batch``: a batch of lengths in memory in, a :class:`BatchPlan` out.

The contract (what every plan holds, and the property tests in ``tests/online/`` check):

* ``plan.steps[k][r]`` is the list of micro-batches rank ``r`` runs in optimizer step ``k``, each
  an ``int64`` array of indices into ``lengths``; every sample is in exactly one step (the PPO /
  GRPO mini-batches, ``mini_batches`` of them, each a random draw of the batch; ``groups`` keeps
  a group's samples in one step);
* every rank runs the same number of micro-batches in a step (``plan.micro_per_step``, chosen by
  the planner, a multiple of ``pp``);
* no micro-batch exceeds ``max_tokens`` (padded tokens in the padded layout; the packed total
  rounded up to ``pad_multiple``), but a sample longer than the budget, alone in its own;
* balanced under ``sync`` (``"micro"``: ranks meet at every micro-batch, FSDP / ZeRO-3; ``"step"``:
  once per optimizer step, DDP with ``no_sync``), by the cost model;
* deterministic: the same lengths and options give the same plan in any process;
* ``plan.step_tokens`` / ``plan.step_samples`` (and ``plan.step_loss_tokens`` for the tokens the
  caller's loss counts) are each step's global counts, for exact loss normalisation; ``figures``
  gives the time against the ideal under both sync models and its lower bound.

``forward_only=True`` plans an inference pass (log-probs, a reference model, values): one pass
(``plan.steps[0]``), its own budget, every micro-batch slot balanced across the ranks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from varpack.errors import ConfigError, InputError
from varpack.online.checks import (
    api_words,
    batch_options,
    group_numbers,
    lengths_array,
    loss_counts,
    shown,
)
from varpack.plan.arrays import PlanArrays
from varpack.plan.batch import batch_config, batch_figures, plan_batch_arrays
from varpack.plan.kernels.compose_threads import default_threads
from varpack.plan.numba_cache import announce_compiles

Steps = list[list[list[np.ndarray]]]
#: said (a logging warning) when a call is about to compile the planner's kernels
COMPILING = (
    "varpack: compiling the planner's numba kernels, once per install or upgrade (up to a "
    "minute of CPU); run `varpack compile` once beforehand (say, when building the image) to "
    "skip it"
)


@dataclass(frozen=True, eq=False)
class BatchPlan:
    """The plan of one batch: which micro-batches each rank runs in each step (see the module
    doc). Built by :func:`plan_batch`; ``arrays`` is the planner's output (one row per
    micro-batch, as in a plan from files)."""

    arrays: PlanArrays
    forward_only: bool = False
    loss_tokens: np.ndarray | None = None  # per sample, as given to plan_batch

    @property
    def num_steps(self) -> int:
        return self.arrays.num_steps

    @property
    def dp(self) -> int:
        return self.arrays.cfg.dp

    @property
    def micro_per_step(self) -> int:
        """Micro-batches every rank runs in every step (the grad-accum the planner chose)."""
        return self.arrays.cfg.grad_accum

    @property
    def sync(self) -> str:
        return str(self.arrays.cfg.sync)

    @property
    def step_tokens(self) -> np.ndarray:
        """Each step's tokens over all ranks (int64): the loss normaliser of a mean token loss."""
        return self.arrays.step_tokens

    @property
    def step_samples(self) -> np.ndarray:
        """Each step's samples over all ranks (int64; a piece of a split sample counts as one)."""
        return self.arrays.step_samples

    @cached_property
    def sample_step(self) -> np.ndarray:
        """The step of every sample of the batch (int64, by index into ``lengths``)."""
        p = self.arrays
        out = np.empty(int(p.ids.max()) + 1, dtype=np.int64)
        out[p.ids[p.stream]] = np.repeat(p.step, p.micro.samples)
        return out

    @cached_property
    def step_loss_tokens(self) -> np.ndarray:
        """Each step's sum of ``loss_tokens`` over all ranks (int64): the normaliser of a loss
        over, say, response tokens. Without ``loss_tokens``, ``step_tokens``."""
        if self.loss_tokens is None:
            return self.step_tokens
        w = np.bincount(self.sample_step, weights=self.loss_tokens, minlength=self.num_steps)
        return w.astype(np.int64)

    @cached_property
    def steps(self) -> Steps:
        """``steps[k][r]``: rank ``r``'s micro-batches in step ``k``, in the order it runs them."""
        return self._nested(self.arrays.ids[self.arrays.stream])

    @cached_property
    def piece_starts(self) -> Steps | None:
        """Shaped like :attr:`steps`: each entry's first token in its sample (``oversize="split"``:
        a piece of a long sample; 0 for a whole one). ``None`` when nothing was split; an
        entry's length is then always the sample's, else it is :attr:`piece_lengths`."""
        p = self.arrays
        return None if p.sample_offsets is None else self._nested(p.sample_offsets[p.stream])

    @cached_property
    def piece_lengths(self) -> Steps | None:
        """Shaped like :attr:`steps`: each entry's tokens (``None`` when nothing was split)."""
        p = self.arrays
        return None if p.sample_offsets is None else self._nested(p.lens[p.stream])

    def rank_steps(self, rank: int) -> list[list[np.ndarray]]:
        """``[steps[k][rank] for k]``: what one rank runs, step by step."""
        rank = self._index("rank", rank, self.dp)
        return [ranks[rank] for ranks in self.steps]

    def digest(self) -> str:
        """A sha256 of the whole plan (hex): every resolved option, each unit's sample, length
        and (split) first token, who runs what, each micro-batch's padded length and counts,
        each step's totals and the ``loss_tokens``. Ranks that planned alike hold the same one;
        any difference in lengths or options that reaches the plan changes it, so one small
        all-gather checks that no rank planned from other lengths or options."""
        p = self.arrays
        head = {"config": p.cfg.to_dict(), "forward_only": self.forward_only,
                "steps": p.num_steps}  # fmt: skip
        h = hashlib.sha256(json.dumps(head, sort_keys=True, default=_plain).encode())
        parts = {
            "ids": p.ids, "lens": p.lens, "stream": p.stream, "offsets": p.offsets,
            "step": p.step, "rank": p.rank, "micro_index": p.micro_index,
            "pad_to": p.micro.pad_to, "rows": p.micro.rows, "samples": p.micro.samples,
            "tokens": p.micro.tokens, "step_tokens": p.step_tokens,
            "step_samples": p.step_samples, "sample_offsets": p.sample_offsets,
            "lengths": p.lengths, "pad_rows": p.pad_rows, "loss_tokens": self.loss_tokens,
        }  # fmt: skip
        for name, part in parts.items():
            data = b"" if part is None else np.ascontiguousarray(part, np.int64).tobytes()
            h.update(f"|{name}:{'-' if part is None else len(data)}|".encode() + data)
        return h.hexdigest()

    @cached_property
    def figures(self) -> dict[str, Any]:
        """``time_vs_ideal`` (under the plan's ``sync``), ``time_vs_ideal_by_sync`` (``step``
        and ``micro``), ``bound`` (the least time vs ideal any composition of its steps'
        samples reaches), ``ideal_time``, ``est_time`` (in cost-model units)."""
        with announce_compiles(COMPILING):
            return batch_figures(self.arrays)

    def pad_to(self, step: int, rank: int) -> np.ndarray:
        """The padded length of each of rank ``rank``'s micro-batches in step ``step`` (the
        packed total rounded up to ``pad_multiple``; in the padded layout, the row length)."""
        at = self._index("step", step, self.num_steps), self._index("rank", rank, self.dp)
        return self.arrays.micro.pad_to[self._rows[at]]  # type: ignore[no-any-return]

    def _index(self, name: str, value: Any, count: int) -> int:
        """A step or rank of the plan (an integer in ``[0, count)``; no bool, no -1)."""
        if (
            isinstance(value, bool | np.bool_)
            or not isinstance(value, int | np.integer)
            or not 0 <= value < count
        ):
            what = f"dp = {count} ranks" if name == "rank" else f"{count} steps"
            raise ConfigError(
                f"{name} {shown(value)} is not one of the plan's {what} (0 to {count - 1})"
            )
        return int(value)

    @cached_property
    def _rows(self) -> np.ndarray:
        """``[steps, dp, K]``: each micro-batch's row in :attr:`arrays`."""
        p = self.arrays
        k, dp = self.micro_per_step, self.dp
        order = np.argsort((p.step * dp + p.rank) * k + p.micro_index, kind="stable")
        return order.reshape(self.num_steps, dp, k)

    def _nested(self, values: np.ndarray) -> Steps:
        p = self.arrays
        k, dp = self.micro_per_step, self.dp
        bounds = p.offsets.tolist()  # by step, rank, then run order
        flat = [values[bounds[i] : bounds[i + 1]] for i in self._rows.ravel().tolist()]
        per_step = dp * k
        return [
            [flat[s * per_step + r * k : s * per_step + (r + 1) * k] for r in range(dp)]
            for s in range(self.num_steps)
        ]


def plan_batch(
    lengths: Any,
    *,
    dp: int,
    max_tokens: int,
    mini_batches: int = 1,
    cost: str = "tokens",
    hidden: int | None = None,
    kv_hidden: int | None = None,
    layers: int | None = None,
    model: Any = None,
    sync: str | None = None,
    layout: str = "packed",
    pad_multiple: int = 1,
    pp: int = 1,
    seed: int = 0,
    forward_only: bool = False,
    groups: Any = None,
    oversize: str | None = None,
    loss_tokens: Any = None,
    max_shapes: int | None = None,
    compose: str = "cost",
) -> BatchPlan:
    """Plan one batch of samples of ``lengths`` tokens (see the module doc for the contract).

    Args:
        lengths: tokens of each sample (1-D, integers > 0), in the batch's order.
        dp: data-parallel ranks.
        max_tokens: token budget of a micro-batch (with ``forward_only``, the inference budget).
        mini_batches: optimizer steps the batch is trained in (PPO / GRPO mini-batches).
        cost: ``tokens``, ``padded`` or ``flops`` (with ``model``; ``hidden``, ``kv_hidden``,
            ``layers`` for Skrull's approximation): what ranks are balanced by.
        model: the model ``flops`` prices: a parsed config.json (dict), a preset name or a
            :class:`~varpack.plan.models.ModelSpec`.
        sync: ``micro`` (ranks meet at every micro-batch: FSDP, ZeRO-3) or ``step`` (once per
            step: DDP with ``no_sync``, pipelines). Default ``micro``, ``step`` with ``pp > 1``
            (where ``micro`` is refused).
        layout: ``packed`` (one row per micro-batch, ``cu_seqlens``) or ``padded`` (B x T).
        pad_multiple: the packed total (packed) or the row length (padded) rounded up to it.
        pp: pipeline stages; the micro-batches per rank and step are a multiple of it.
        seed: the draw of the steps and of each step's order.
        forward_only: plan an inference pass (one pass, no optimizer steps).
        groups: samples kept in one step: a group number per sample, or an int ``g`` for runs
            of ``g`` consecutive samples (GRPO: the responses of one prompt).
        oversize: a sample longer than ``max_tokens``: ``alone`` (a micro-batch of its own, up
            to 4 budgets), ``split`` (pieces of the budget) or ``error``. Default ``alone``;
            ``error`` with ``pp > 1`` or ``max_shapes`` (where a lone sample would need a shape
            of its own, and ``alone`` is refused).
        loss_tokens: tokens of each sample the loss counts (say, its response); their sum per
            step is ``plan.step_loss_tokens``.
        max_shapes: at most this many padded lengths over the whole plan (packed layout: each
            micro-batch padded up to one of them, within the budget), for compiled models.
        compose: ``cost`` (the composer) or ``engine`` (the balance engine, packed layout
            without ``pp``: each step composed for the time under ``sync``).

    Raises:
        ConfigError, InputError: one line saying what is wrong and what to do.
    """
    default_threads()  # a bad $VARPACK_THREADS is refused here as by every command
    o = batch_options(
        dp=dp, max_tokens=max_tokens, mini_batches=mini_batches, cost=cost, hidden=hidden,
        kv_hidden=kv_hidden, layers=layers, model=model, sync=sync, layout=layout,
        pad_multiple=pad_multiple,
        pp=pp, seed=seed, forward_only=forward_only, oversize=oversize, max_shapes=max_shapes,
        compose=compose,
    )  # fmt: skip
    lens = lengths_array(lengths)
    group = group_numbers(groups, len(lens))
    loss = loss_counts(loss_tokens, lens)
    try:
        cfg = batch_config(**o.config)
        with announce_compiles(COMPILING):
            arrays = plan_batch_arrays(lens, cfg, o.mini_batches, group)
    except (ConfigError, InputError) as err:
        raise type(err)(api_words(str(err))) from None
    return BatchPlan(arrays, o.forward_only, loss)


def _plain(value: Any) -> Any:
    """A NumPy scalar of a config as JSON takes it (for :meth:`BatchPlan.digest`)."""
    return value.item() if isinstance(value, np.generic) else str(value)
