"""The plan artifact: what every reader of a plan needs, and nothing of how it is made.

Owns: the format (:mod:`.format`: ``plan.json`` + one Parquet manifest per rank, atomic write,
verified read; :mod:`.schema`: plan.json's keys and types, the plan fingerprint and checksum,
built from the type checks of :mod:`.spec`; :mod:`.rankfiles`: rank files as plain declared
files inside the plan), the planner's arrays
turned into manifest tables (:mod:`.tables`, with the carried columns' values), a manifest read as
arrays (:mod:`.rankrows`), a plan's figures recomputed from its rows (:mod:`.recompute`: what
``validate`` checks and ``replan`` writes, so both agree), the one-line problems those readers
report (:mod:`.report`), a plan opened by MPI ranks together, each verifying its share of the
rank files (:mod:`.opened`), and the trainer's synchronisation held to the plan's ``sync``
(:mod:`.trainer_sync`, pure: the torch reader and the integrations print its line).
May import: the ground floor, :mod:`varpack.plan` (its config, rule and figure functions) and
:mod:`varpack.sort`'s agreement (:mod:`.opened` under MPI). Nothing here reads an input, plans or
checks: that is :mod:`varpack.make` and :mod:`varpack.validate`, which sit above it with
:mod:`varpack.inspect`, :mod:`varpack.torch` and :mod:`varpack.cli`; :mod:`varpack.plan` never
imports it.
"""

from varpack.planfile.format import Plan, load_plan, write_plan

__all__ = ["Plan", "load_plan", "write_plan"]
