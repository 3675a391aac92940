"""The planner's kernels: pure array functions (most of them numba), no stage logic of their own.

Owns, one module each:

- :mod:`.inputs`: a kernel's read-only inputs in the one form numba compiles it for (``frozen``);
- :mod:`.pack`: packing an ordered stream into micro-batches, by budget or fixed count;
- :mod:`.cuts`: where greedy packing cuts, found from every row at once;
- :mod:`.order`: the epoch orders (curriculum, windowed shuffle), windows sorted and dealt to steps;
- :mod:`.permute`: the random permutation of a shuffled epoch, drawn from ``(seed, epoch)``;
- :mod:`.split`: long documents cut into pieces (``--oversize split``) and merged with the rest;
- :mod:`.compose`: shuffled steps composed by cost, each window's samples dealt to (step, rank) slots;
- :mod:`.compose_threads`: an epoch composed by cost on several threads, the carry resolved after;
- :mod:`.window`: one window of the cost composition, its samples dealt to ``p`` steps x ``dp`` slots;
- :mod:`.heavy`: a window's heavy samples, which they are and which wait for the next window;
- :mod:`.shares`: a blend's shares repaired step by step, by swaps of like-sized samples;
- :mod:`.level`: a composed window's slots levelled by swaps (grad-accum 1, ``--sync micro``);
- :mod:`.steplevel`: a composed window's steps levelled by moves and swaps (grad-accum > 1,
  ``--sync step``);
- :mod:`.lpt`: a window dealt window-wide, longest-processing-time first (grad-accum 1);
- :mod:`.bands`: padded-layout windows cut into bands, the bands dealt to steps by cost;
- :mod:`.bandlevel`: a block's bands levelled by moving rows (padded layout, slots cut by cost);
- :mod:`.slots`: micro-batches cut into slots by cost, and the slots dealt to steps;
- :mod:`.lanes`: which rank takes which micro-batch of a slot, so each rank's step sum is level;
- :mod:`.assign`: micro-batches to steps, and each step's micro-batches to ranks (LPT and swaps);
- :mod:`.runs`: sorted runs of long samples, the least waiting a window's ranks must leave (for
  the bound on time vs ideal);
- :mod:`.micro`: the figures of micro-batches (samples, tokens, longest, shape, cost);
- :mod:`.shapes`: bounded shape lengths, at most K, chosen to minimise padding.

May import: NumPy, numba, ``varpack.errors``, each other, and the shared rules at the top of
:mod:`varpack.plan` (``rules``, ``cost``, ``segments``); never a stage, ``cp``, ``figures`` or the
planner.
"""
