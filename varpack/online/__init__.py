"""Planning in memory, inside a training loop: one batch at a time (RL rollout batches).

``varpack plan`` plans a dataset from files before training; an RL trainer only has its samples
after generation, a new batch every iteration. :func:`plan_batch` plans such a batch in
milliseconds with the same planner (cost models, balance under the trainer's synchronisation,
equal micro-batch counts, exact loss normalisation, bounded shapes, pipeline multiples) and
returns a :class:`BatchPlan`: which micro-batches each rank runs in each optimizer step. Every
rank that holds the batch's lengths computes the same plan, without communicating. Pure NumPy:
no torch here; tensors in and out are :mod:`varpack.torch.rollout`'s [errors, plan].
:func:`compile_kernels` (``varpack compile``) compiles the planner's kernels ahead, once per
install: a first call otherwise compiles them (up to a minute of CPU, said in a logging warning).
"""

from varpack.online.batch import BatchPlan, plan_batch
from varpack.online.precompile import compile_kernels

__all__ = ["BatchPlan", "compile_kernels", "plan_batch"]
