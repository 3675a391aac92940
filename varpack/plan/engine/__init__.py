"""The balance engine (``--compose engine``): one objective, one constructor, one levelling.

The plan's time under its sync model is the sum, over the groups the ranks meet at (steps under
``--sync step``, micro-batch slots under ``--sync micro``), of the group's costliest rank
(:mod:`varpack.plan.sync`). The engine composes each window of the shuffled stream for that
objective (:mod:`.window`): heavy samples a group at a time, the rest dealt to the bin furthest
below its target, then each group levelled by the moves and swaps that lower it. The regimes
(grad-accum, step or micro) are data: the size of a bin and the number of groups a step.

It covers shuffled budget batching in the packed layout without ``--pp`` or a blend, in one
process, on threads and under MPI, and the steps of ``plan_batch(compose="engine")``; the
composer of ``--compose cost`` covers the rest while the two are compared.
"""
