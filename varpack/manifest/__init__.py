"""The plan artifact: its on-disk format, and everything that reads a plan without the planner.

Owns: the format (:mod:`.format`: ``plan.json`` + one Parquet manifest per rank, atomic write,
checked read; :mod:`.schema`: plan.json's keys and types and the plan fingerprint;
:mod:`.rankfiles`: rank files as plain declared files inside the plan), turning the planner's arrays into manifest tables (:mod:`.tables`), the I/O edge
of ``varpack plan`` (:mod:`.make`: read the input, plan, write) with the metadata columns it
carries into the manifests (:mod:`.carry`: ``--carry``, joined by sample id), ``inspect`` (:mod:`.inspect`:
the figures as text or JSON) and its plot (:mod:`.plot`), and ``validate`` (:mod:`.validate`, a
package: an independent recomputation of every promise a plan makes); under MPI, a plan opened
with its rank files verified in shares (:mod:`.opened`, for ``inspect``).
May import: the ground floor, :mod:`varpack.metadata` and :mod:`varpack.sort` (to read an input;
its :mod:`~varpack.sort.agree` and :mod:`~varpack.sort.exchange` under MPI),
and :mod:`varpack.plan` (its rule functions, so that validate checks with the planner's own
rules). :mod:`varpack.plan` never imports this package.
"""

from varpack.manifest.format import Plan, load_plan, write_plan

__all__ = ["Plan", "load_plan", "write_plan"]
