"""The small dataclasses that pass between the planner's stages, and the finished plan.

Each stage takes the output of the ones before it and returns its own (see
:mod:`varpack.plan.planner` for the order): :class:`Selection` (select), :class:`Batches` (order +
pack), :class:`Shapes` (shapes), :class:`Placement` (assign and warm-up), and finally
:class:`PlanArrays`, the plan as arrays that :mod:`varpack.planfile` turns into files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from varpack.plan.config import PlanConfig
from varpack.plan.kernels.micro import Micro


@dataclass
class Selection:
    """The samples to plan (input order) and what happened to the others."""

    cfg: PlanConfig  # resolved, with data-dependent defaults filled (block length)
    ids: np.ndarray
    lens: np.ndarray
    alone: np.ndarray  # bool per kept sample: gets a micro-batch of its own (--oversize alone)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    # --oversize split: each unit's first token in its document, and its split document's
    # number (-1: a whole document); None when no document is split
    offsets: np.ndarray | None = None
    group: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)  # warnings for the I/O edge to print

    @property
    def oversize_alone(self) -> list[int]:
        return [int(i) for i in self.ids[self.alone]] if self.alone.any() else []


@dataclass
class Batches:
    """Micro-batches of all epochs, numbered into steps, before ranks.

    Micro-batch ``i`` is stream positions ``offsets[i]:offsets[i+1]``; ``stream`` maps positions
    to rows of the selection. A batching strategy may fix the shape (``pad_to``, ``pad_rows``),
    number blocks (``block_index`` per stream position) or ask that consecutive runs of
    ``group`` micro-batches go to one rank.
    """

    stream: np.ndarray
    offsets: np.ndarray
    step: np.ndarray
    epochs: list[dict[str, int]]
    pad_to: np.ndarray | None = None
    pad_rows: np.ndarray | None = None
    block_index: np.ndarray | None = None
    group: int = 0
    stream_lens: np.ndarray | None = None  # lens[stream], where the strategy has it at hand
    moved: dict[str, float] | None = None  # shuffled: the moved_* stats, where tallied here


@dataclass
class Shapes:
    """Each micro-batch's figures and shape, the chosen shape lengths, its empty rows."""

    micro: Micro
    lengths: np.ndarray | None  # --max-shapes / --pack-to lengths
    pad_rows: np.ndarray | None  # per micro-batch, where the manifest has that column
    stream_lens: np.ndarray  # the selection's lengths in stream order


@dataclass
class Placement:
    """Where and when each micro-batch runs: its rank, step and position in the step."""

    rank: np.ndarray
    step: np.ndarray
    micro_index: np.ndarray
    micro: Micro  # may change here: one shape per pipeline step
    warmup: np.ndarray | None = None  # per micro-batch (--warmup reorder)


@dataclass
class PlanArrays:
    """A plan as arrays: the sample stream and per micro-batch / per step columns."""

    cfg: PlanConfig
    ids: np.ndarray  # kept samples (input order)
    lens: np.ndarray
    stream: np.ndarray  # stream position -> row of ids/lens (all epochs)
    offsets: np.ndarray  # micro-batch i = stream[offsets[i]:offsets[i+1]]
    micro: Micro
    step: np.ndarray
    rank: np.ndarray
    micro_index: np.ndarray
    step_tokens: np.ndarray
    step_samples: np.ndarray
    lr: np.ndarray
    epochs: list[dict[str, int]]
    dropped: list[dict[str, Any]] = field(default_factory=list)
    oversize_alone: list[int] = field(default_factory=list)
    lengths: np.ndarray | None = None  # the chosen shape lengths (--max-shapes / --pack-to)
    pad_rows: np.ndarray | None = None  # per micro-batch (the manifest column, where it applies)
    block_index: np.ndarray | None = None  # per stream position (--batching blocks)
    warmup: np.ndarray | None = None  # per micro-batch (--warmup reorder)
    stream_lens: np.ndarray | None = None  # lens[stream] (kept: gathering it again is costly)
    moved: dict[str, float] | None = None  # the moved_* stats where batching tallied them
    cp_placement: np.ndarray | None = None  # per stream position (--cp): CP rank, -1 distributed
    cp_cost: np.ndarray | None = None  # per micro-batch (--cp): time of its slowest CP rank
    # --oversize split: each unit's offset in its document and split document number (None
    # when nothing is split; ``offsets`` above is the micro-batches' bounds)
    sample_offsets: np.ndarray | None = None
    group: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)  # warnings (--oversize alone)

    @property
    def num_steps(self) -> int:
        return len(self.lr)
