"""A plan's figures: what plan.json says about the plan, computed from the planner's arrays.

Owns: the stats that score a plan (:mod:`.stats`: padding, time versus ideal, imbalance, mixing,
each rank's shapes) and plan.json's content (:mod:`.plan_json`: ``plan_meta``, ``plan_figures``,
``input_info``), which ``validate`` recomputes from the manifests, and how ``plan``,
``validate`` and ``inspect`` word them (:mod:`.words`: samples and pieces, epochs, LR factors).
May import anything else in :mod:`varpack.plan` (it is the last step, after every stage) and
``varpack.fingerprint``; nothing in :mod:`varpack.plan` but the planner imports it.
"""
