"""Every name an option may take is a strategy in its stage's registry, and the reverse."""

from __future__ import annotations

import dataclasses

import pytest

from varpack.plan.config import CHOICES, PlanConfig
from varpack.plan.cost import COST_MODELS
from varpack.plan.cp.place import CP_PLACEMENTS
from varpack.plan.kernels.order import ORDERS
from varpack.plan.lr import LR_SCALINGS
from varpack.plan.stages.batching import BATCHERS, batcher_name
from varpack.plan.stages.select import OVERSIZE
from varpack.plan.stages.warmup import WARMUPS
from varpack.plan.sync import SYNC_MODELS

REGISTRIES = {
    "order": ORDERS,
    "cost": COST_MODELS,
    "lr_scaling": LR_SCALINGS,
    "oversize": OVERSIZE,
    "warmup": WARMUPS,
    "cp_placement": CP_PLACEMENTS,
    "sync": SYNC_MODELS,
}


@pytest.mark.parametrize("option", sorted(REGISTRIES))
def test_choices_are_the_registry(option: str) -> None:
    assert set(CHOICES[option]) == set(REGISTRIES[option])


def test_every_batching_reaches_a_batcher() -> None:
    seen = set()
    for batching in CHOICES["batching"]:
        for layout in CHOICES["layout"]:
            for pp in (1, 2):
                for order in CHOICES["order"]:
                    for compose in CHOICES["compose"]:
                        cfg = dataclasses.replace(
                            PlanConfig(),
                            batching=batching,
                            layout=layout,
                            pp=pp,
                            order=order,
                            compose=compose,
                        )
                        seen.add(batcher_name(cfg))
    for cp_batching in CHOICES["cp_batching"]:
        seen.add(batcher_name(dataclasses.replace(PlanConfig(), cp=2, cp_batching=cp_batching)))
    assert seen == set(BATCHERS)


def test_every_option_has_help() -> None:
    for f in dataclasses.fields(PlanConfig):
        assert len(f.metadata.get("help", "")) > 10, f.name
