"""The planner's stages, each a function that passes a dataclass of :mod:`varpack.plan.arrays` on.

Owns: select (:mod:`.select`), order + pack (:mod:`.batching`, one module per batching strategy),
shapes (:mod:`.shaping`), assign (:mod:`.placement`), warm-up (:mod:`.warmup`) and the curriculum's
levelling by cost (:mod:`.levelling`); :mod:`varpack.plan.planner` calls them in order.
May import: ``varpack.errors``, the kernels (:mod:`varpack.plan.kernels`), the CP cost model
(:mod:`varpack.plan.cp.cost`) and the options, arrays and rules at the top of :mod:`varpack.plan`;
never ``figures`` or the planner.
"""
