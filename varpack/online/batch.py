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
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from varpack.errors import ConfigError, InputError
from varpack.plan.arrays import PlanArrays
from varpack.plan.batch import batch_config, batch_figures, plan_batch_arrays
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
        if not 0 <= rank < self.dp:
            raise ConfigError(f"rank {rank} is not one of the plan's dp = {self.dp} ranks")
        return [ranks[rank] for ranks in self.steps]

    def digest(self) -> str:
        """A sha256 of who runs what (hex): ranks that planned alike hold the same one, so one
        small all-gather checks that no rank planned from other lengths or options."""
        h = hashlib.sha256()
        p = self.arrays
        for part in (p.ids[p.stream], p.offsets, p.step, p.rank, p.micro_index):
            h.update(np.ascontiguousarray(part, dtype=np.int64).tobytes() + b"|")
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
        return self.arrays.micro.pad_to[self._rows[step, rank]]  # type: ignore[no-any-return]

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
    sync: str = "micro",
    layout: str = "packed",
    pad_multiple: int = 1,
    pp: int = 1,
    seed: int = 0,
    forward_only: bool = False,
    groups: Any = None,
    oversize: str = "alone",
    loss_tokens: Any = None,
    max_shapes: int | None = None,
) -> BatchPlan:
    """Plan one batch of samples of ``lengths`` tokens (see the module doc for the contract).

    Args:
        lengths: tokens of each sample (1-D, integers > 0), in the batch's order.
        dp: data-parallel ranks.
        max_tokens: token budget of a micro-batch (with ``forward_only``, the inference budget).
        mini_batches: optimizer steps the batch is trained in (PPO / GRPO mini-batches).
        cost: ``tokens``, ``padded`` or ``flops`` (with ``hidden``, ``kv_hidden``, ``layers``):
            what ranks are balanced by.
        sync: ``micro`` (ranks meet at every micro-batch: FSDP, ZeRO-3) or ``step`` (once per
            step: DDP with ``no_sync``; the one with ``pp > 1``).
        layout: ``packed`` (one row per micro-batch, ``cu_seqlens``) or ``padded`` (B x T).
        pad_multiple: the packed total (packed) or the row length (padded) rounded up to it.
        pp: pipeline stages; the micro-batches per step are a multiple of it.
        seed: the draw of the steps and of each step's order.
        forward_only: plan an inference pass (one pass, no optimizer steps).
        groups: samples kept in one step: a group number per sample, or an int ``g`` for runs
            of ``g`` consecutive samples (GRPO: the responses of one prompt).
        oversize: a sample longer than ``max_tokens``: ``alone`` (a micro-batch of its own, up
            to 4 budgets), ``split`` (pieces of the budget) or ``error``.
        loss_tokens: tokens of each sample the loss counts (say, its response); their sum per
            step is ``plan.step_loss_tokens``.
        max_shapes: at most this many padded lengths over the whole plan (packed layout: each
            micro-batch padded up to one of them, within the budget), for compiled models.

    Raises:
        ConfigError, InputError: one line saying what is wrong and what to do.
    """
    lens = _lengths(lengths)
    if (
        isinstance(mini_batches, bool)
        or not isinstance(mini_batches, int | np.integer)
        or mini_batches < 1
    ):
        raise ConfigError(f"mini_batches={mini_batches!r}: must be an integer >= 1")
    if forward_only and mini_batches != 1:
        raise ConfigError("forward_only plans one pass: leave mini_batches at 1")
    if sync not in ("micro", "step"):
        raise ConfigError(f"sync={sync!r}: choose micro or step")
    if layout == "padded" and (pp > 1 or max_shapes is not None):
        what = "pp > 1" if pp > 1 else "max_shapes"
        raise ConfigError(f"{what} needs layout='packed' here (the padded layout is cut sorted)")
    if forward_only and pp == 1:
        sync = "micro"  # an inference pass: every slot balanced, whatever the trainer waits on
    options = dict(
        dp=dp, max_tokens=max_tokens, cost=cost, hidden=hidden, kv_hidden=kv_hidden,
        layers=layers, sync=sync, layout=layout, pad_multiple=pad_multiple, pp=pp, seed=seed,
        oversize=oversize, max_shapes=max_shapes,
    )  # fmt: skip
    if oversize not in ("alone", "split", "error"):
        raise ConfigError(f"oversize={oversize!r}: choose alone, split or error")
    try:
        cfg = batch_config(**options)
        with announce_compiles(COMPILING):
            arrays = plan_batch_arrays(lens, cfg, int(mini_batches), _groups(groups, len(lens)))
    except (ConfigError, InputError) as err:
        raise type(err)(_api_words(str(err))) from None
    except TypeError:  # an unhashable option value
        raise ConfigError("plan_batch: options must be plain numbers and strings") from None
    return BatchPlan(arrays, forward_only, _per_sample(loss_tokens, len(lens), "loss_tokens"))


def _lengths(lengths: Any) -> np.ndarray:
    lens = np.asarray(lengths)
    if lens.ndim != 1 or len(lens) == 0:
        raise InputError(f"lengths: a non-empty 1-D sequence of integers, not shape {lens.shape}")
    if not np.issubdtype(lens.dtype, np.integer):
        raise InputError(f"lengths: integers of tokens per sample, not {lens.dtype}")
    bad = np.flatnonzero(lens <= 0)
    if len(bad):
        raise InputError(f"lengths[{int(bad[0])}] = {int(lens[bad[0]])}: every length must be > 0")
    return lens.astype(np.int64, copy=False)


def _groups(groups: Any, n: int) -> np.ndarray | None:
    """A group number per sample (``None``: every sample on its own)."""
    if groups is None:
        return None
    if isinstance(groups, int | np.integer) and not isinstance(groups, bool):
        if groups < 1:
            raise ConfigError(f"groups={groups}: a group size must be >= 1")
        return np.arange(n, dtype=np.int64) // int(groups)
    return _per_sample(groups, n, "groups")


def _per_sample(values: Any, n: int, name: str) -> np.ndarray | None:
    if values is None:
        return None
    arr = np.asarray(values)
    if arr.shape != (n,) or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(
            f"{name}: one integer per sample ({n}), not {arr.dtype} of shape {arr.shape}"
        )
    if name == "loss_tokens" and (arr < 0).any():
        raise InputError(f"loss_tokens[{int(np.argmax(arr < 0))}] is negative; counts are >= 0")
    return arr.astype(np.int64, copy=False)


def _api_words(message: str) -> str:
    """A planner message in the API's words: ``--max-tokens 0`` is ``max_tokens=0`` here, and
    a sample is named by its index."""
    message = re.sub(r"--([a-z][a-z-]*) ", lambda m: m.group(1).replace("-", "_") + "=", message)
    message = re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)
    return message.replace("sample_id", "sample")
