"""The shape and budget rules of a micro-batch: the one source of truth.

The packing kernel (compiled with numba), the planner's vectorised code and ``varpack validate``
all call these functions, so a micro-batch the planner accepts is exactly one validate accepts.
They are plain arithmetic, so each works on Python ints, NumPy scalars and NumPy arrays alike;
``register_jitable`` lets compiled kernels call them too.

* ``pad_to`` — packed: the total length rounded up to ``pad_multiple``; padded: the longest
  sample rounded up to ``pad_multiple`` (every row is padded to it).
* ``volume`` — tokens the model actually processes: packed ``pad_to``; padded ``B x pad_to``.
* ``fits`` — the budget rule: ``volume <= max_tokens``.
"""

from __future__ import annotations

from typing import Any

from numba.extending import register_jitable

PACKED = 0
PADDED = 1
LAYOUT_CODE = {"packed": PACKED, "padded": PADDED}


@register_jitable
def round_up(x: Any, m: Any) -> Any:
    """Smallest multiple of ``m`` that is >= ``x``.

    >>> round_up(10, 8), round_up(16, 8), round_up(1, 1)
    (16, 16, 1)
    """
    return -(-x // m) * m


@register_jitable
def pad_to(count: Any, tokens: Any, max_len: Any, layout: int, multiple: Any) -> Any:
    """Padded length of a micro-batch of ``count`` samples, ``tokens`` in all, longest ``max_len``.

    >>> pad_to(3, 20, 9, PACKED, 8), pad_to(3, 20, 9, PADDED, 8)
    (24, 16)
    """
    if layout == PACKED:
        return round_up(tokens, multiple)
    return round_up(max_len, multiple)


@register_jitable
def volume(count: Any, padded_len: Any, layout: int) -> Any:
    """Tokens the model processes for the micro-batch (its shape's size).

    >>> volume(3, 24, PACKED), volume(3, 16, PADDED)
    (24, 48)
    """
    if layout == PACKED:
        return padded_len + 0 * count
    return count * padded_len


@register_jitable
def fits(count: Any, tokens: Any, max_len: Any, layout: int, multiple: Any, budget: Any) -> Any:
    """The budget rule: does the micro-batch's volume stay within ``budget`` tokens?

    >>> fits(10, 30, 3, PACKED, 1, 30), fits(4, 28, 7, PADDED, 1, 30), fits(5, 35, 7, PADDED, 1, 30)
    (True, True, False)
    """
    return volume(count, pad_to(count, tokens, max_len, layout, multiple), layout) <= budget


def capacity(multiple: int, budget: int) -> int:
    """The most real tokens a micro-batch holds under the budget rule (one sample, or the
    packed total, rounded up to ``multiple`` within ``budget``).

    >>> capacity(1, 100), capacity(8, 100), capacity(64, 100)
    (100, 96, 64)
    """
    return (budget // multiple) * multiple
