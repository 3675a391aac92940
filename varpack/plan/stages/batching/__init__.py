"""Stage 2, order and pack: the micro-batches of every epoch, numbered into steps.

A batching strategy, chosen by name from :data:`BATCHERS` (:func:`batcher_name` maps the config
to it), runs the epochs: each epoch's stream comes from the order stage
(:func:`~varpack.plan.stages.batching.common.epoch_order`, the ``--order`` strategy), the strategy
cuts it into micro-batches and numbers them into steps (``dp x grad_accum`` micro-batches a step):

* ``greedy`` (:mod:`.greedy`): budget or fixed-count micro-batches of consecutive samples;
* ``costed`` (:mod:`.costed`): shuffled budget batching in the packed layout, steps composed by
  cost so that every rank of a step carries the same cost (``--compose cost``);
* ``banded`` (:mod:`.banded`): the same in the padded layout, over bands of similar lengths;
* ``engine`` (:mod:`.engine`): the balance engine (``--compose engine``), packed layout;
* ``pipeline`` (:mod:`.pipeline`): ``--pp`` in the padded layout, (step, rank) groups of one shape;
* ``blocks`` (:mod:`.blocks`): fixed-length blocks of whole samples (BLoad);
* ``gds`` (:mod:`.gds`): ``--cp`` steps re-formed across DP ranks (Skrull's global scheduling).

A new way of batching is a new module here and an entry in :data:`BATCHERS`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from varpack.plan.arrays import Batches, Selection
from varpack.plan.config import PlanConfig
from varpack.plan.kernels.split import fit_len
from varpack.plan.stages.batching import banded, blocks, costed, engine, gds, greedy, pipeline

Batcher = Callable[
    [np.ndarray, np.ndarray, PlanConfig, np.ndarray | None, np.ndarray | None], Batches
]

#: strategy name -> ``build(lens, alone, cfg, lengths, group) -> Batches``; ``group`` numbers
#: the pieces of split documents (``--oversize split``, greedy only), which never share a
#: micro-batch
BATCHERS: dict[str, Batcher] = {
    "greedy": greedy.build,
    "costed": costed.build,
    "engine": engine.build,
    "banded": banded.build,
    "pipeline": pipeline.build,
    "blocks": blocks.build,
    "gds": gds.build,
}


def batcher_name(cfg: PlanConfig) -> str:
    """The batching strategy a config asks for."""
    if cfg.batching == "blocks":
        return "blocks"
    if cfg.cp > 1 and cfg.cp_batching == "gds":
        return "gds"
    if composes_by_cost(cfg):
        if cfg.compose == "engine":
            return "engine"
        return "banded" if cfg.layout == "padded" else "costed"
    if cfg.pp > 1 and cfg.layout == "padded":
        return "pipeline"
    return "greedy"


def composes_by_cost(cfg: PlanConfig) -> bool:
    """``--compose cost`` applies: shuffled budget batching without ``--cp``, and no
    ``--oversize split`` with a ``--split-len`` below the budget (the greedy batcher keeps such
    pieces apart; full-budget pieces, the default, never fit two to a micro-batch)."""
    return (
        cfg.compose in ("cost", "engine")
        and (
            cfg.oversize != "split"
            or cfg.split_len == fit_len(cfg.max_tokens or 0, cfg.pad_multiple)
        )
        and cfg.order == "shuffle"
        and cfg.batching == "budget"
        and cfg.cp == 1
    )


def build_batches(chosen: Selection, lengths: np.ndarray | None) -> Batches:
    """Micro-batches and steps of all epochs over the selected samples."""
    cfg = chosen.cfg
    return BATCHERS[batcher_name(cfg)](chosen.lens, chosen.alone, cfg, lengths, chosen.group)
