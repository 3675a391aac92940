"""Context parallelism (``--cp N``): the CP stage, its placement strategies and its cost model.

Owns: the stage that places each micro-batch's samples on the CP ranks (:mod:`.stage`), the
placement strategies and their registry ``CP_PLACEMENTS`` (:mod:`.place`, numba kernels), and the
per-CP-rank time and memory model (:mod:`.cost`). May import: NumPy, numba, ``varpack.errors``,
each other, and the options, arrays and cost model at the top of :mod:`varpack.plan`; never a
stage, a kernel, ``figures`` or the planner.
"""
