"""What ``plan`` under MPI plans, and the one line that refuses the rest.

The ranks plan both orders (curriculum; shuffle composed by cost in the packed layout or by
tokens), budget or fixed batching, packed or padded, any ``--dp``/``--grad-accum``/``--epochs``,
``--oversize``, ``--cost`` levelling, ``--max-shapes``, ``--pack-to``, every ``--warmup``,
``--lr-scaling``, ``--carry``, ``--where``, ``--cp`` and ``--pp`` in the packed layout, and write
the one-process plan byte for byte. An option whose stage is not shared out yet is refused under
P > 1 before any work: the same command without ``mpiexec`` plans it.
"""

from __future__ import annotations

import os

from varpack.errors import ConfigError
from varpack.plan import PlanConfig
from varpack.plan.stages.batching import composes_by_cost
from varpack.sort.output import is_sorted_output


def refusal(cfg: PlanConfig, input: str | os.PathLike[str], mix: bool) -> str | None:
    """The option ``plan`` cannot yet share over ranks (``None``: every one can)."""
    if not is_sorted_output(input):
        return (
            f"{input} is raw metadata: under mpiexec each rank reads a share of a sorted input; "
            "run varpack sort first (it runs under mpiexec too) and plan its output"
        )
    options = [
        (composes_by_cost(cfg) and cfg.layout == "padded", "--compose cost in the padded layout"),
        (cfg.batching == "blocks", "--batching blocks"),
        (cfg.pp > 1 and cfg.layout == "padded", "--pp in the padded layout"),
        (mix, "--mix"),
    ]
    for hit, name in options:
        if hit:
            return not_shared(name)
    return None


def not_shared(flag: str) -> str:
    """The line that refuses ``flag`` under P > 1."""
    return (
        f"{flag} is not planned across MPI ranks yet: run the same varpack plan without "
        "mpiexec (one process writes the same plan), or leave the option out"
    )


def check_supported(cfg: PlanConfig, input: str | os.PathLike[str], mix: bool) -> None:
    """Raise :class:`ConfigError` with :func:`refusal`'s line, if any."""
    line = refusal(cfg, input, mix)
    if line is not None:
        raise ConfigError(line)
