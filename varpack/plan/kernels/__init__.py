"""The planner's kernels: pure array functions (most of them numba), no stage logic of their own.

Owns: packing a stream into micro-batches (:mod:`.pack`), composing shuffled steps by cost
(:mod:`.compose`), the epoch orders and their permutation (:mod:`.order`, :mod:`.permute`),
splitting long documents into pieces (:mod:`.split`), balancing micro-batches over ranks
(:mod:`.assign`), micro-batch figures (:mod:`.micro`) and bounded shape lengths (:mod:`.shapes`).
May import: NumPy, numba, ``varpack.errors``, each other, and the shared rules at the top of
:mod:`varpack.plan` (``rules``, ``cost``, ``segments``); never a stage, ``cp``, ``figures`` or the
planner.
"""
