"""A kernel's read-only inputs in the one form numba compiles it for.

numba compiles a kernel again for every variant of its argument types it meets, and an array's
type includes its layout and its readonly flag: the same lengths arrive writable (computed),
read-only (an Arrow column, a memory map) or as a slice. Each variant costs a compile (about a
second of CPU, in every process whose cache lacks it). Entry points pass their inputs through
:func:`frozen`, so each kernel has one signature whatever its caller holds.
"""

from __future__ import annotations

import numpy as np


def frozen(a: np.ndarray, dtype: type | None = None) -> np.ndarray:
    """``a`` C-contiguous, of ``dtype``, read-only: a view, or a copy where the layout or the
    dtype differ. For arrays a kernel only reads.

    >>> x = np.arange(4)
    >>> v = frozen(x)
    >>> v.flags.writeable, x.flags.writeable, np.shares_memory(v, x)
    (False, True, True)
    >>> frozen(x[::2], np.int32).tolist()
    [0, 2]
    """
    view = np.ascontiguousarray(a, dtype=dtype).view()
    view.flags.writeable = False
    return view
