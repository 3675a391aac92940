"""Where each row of a padded rollout batch has its response: the columns a ``[B, W]`` entry holds.

A rollout's ``[B, W]`` entries (``W`` below the width ``T`` of ``input_ids``: ``responses``,
``response_mask``, ``old_log_probs``, ``advantages`` ...) hold one value per token of each row's
response, its first tokens first (right-padded, as verl holds responses): column ``c`` of row
``i`` is the token at column ``starts[i] + c`` of ``input_ids``, and :func:`response_starts`
finds ``starts`` from the masks, in two readings:

* **verl's layout**: prompts left-padded to ``P = T - W`` columns, responses right-padded after
  them (verl's ``DataProto``, OpenRLHF's and TRL's prompt + completion). Every row's real tokens
  run through column ``P``, and its response starts there; the attention mask alone says so;
* **the response mask's**: each row's response ends on the row's last real token, which its
  ``response_mask`` marks: right-padded rows (prompt, response, padding), left-padded ones
  (padding, prompt, response) and a mix of both. The response starts ``k`` columns before the
  row's end, ``k`` the response mask's last marked column + 1.

Which one: verl's where a row is padded on both sides (only verl's layout has such a row), where
the response mask agrees with it, or does not fit the rows; else (every row right- or left-padded)
the response mask's. ``responses`` (the response's token ids), when given, must be the tokens of
``input_ids`` from each row's response start: where they are not, but are under the other reading,
that one is taken (verl's layout with prompts of one length and unmarked response ends); else the
batch is refused in one line. Without a response mask only verl's layout is read: a batch it does
not fit is refused, and so is one where no row is padded on both sides and no ``responses`` say
it is verl's (right-padded rows of prompts of any length fit it too); so is a response mask longer
than its row, and a row whose real tokens have a gap. ``prompts`` (verl's ``[B, P']``,
left-padded) are the ``P'`` columns before each row's response.

All NumPy / torch over whole rows: no loop over samples. Imports: torch, NumPy,
:mod:`varpack.errors`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from varpack.errors import InputError

#: verl's left-padded prompts, [B, P']: the columns before each row's response
PROMPTS = "prompts"
#: the response's token ids (verl's name): they tell which reading is right where both fit
RESPONSES = "responses"
#: why a response starts where it does, in the lines (True: verl's layout)
RULE = {True: "verl's layout", False: "the last mark of its response_mask on its last token"}
#: how verl's layout is put in the lines
VERL = "verl's layout: prompts left-padded to one length, responses right-padded after them"


class Rows(NamedTuple):
    """Each row's first real column, one past its last, and its real tokens."""

    first: np.ndarray
    end: np.ndarray
    lengths: np.ndarray


def row_spans(keep: torch.Tensor) -> Rows:
    """The :class:`Rows` of a boolean ``[B, T]`` mask whose every row holds a real token."""
    k = keep.to(torch.uint8)
    first = k.argmax(dim=1).numpy().astype(np.int64)
    end = keep.shape[1] - k.flip(1).argmax(dim=1).numpy().astype(np.int64)
    return Rows(first, end, k.sum(dim=1).numpy().astype(np.int64))


def marked(mask: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Each row of a ``[B, W]`` mask: its first marked column and one past its last (both 0
    where it marks nothing)."""
    nz = (mask != 0).to(torch.uint8)
    some = nz.any(dim=1).numpy()
    first = np.where(some, nz.argmax(dim=1).numpy(), 0).astype(np.int64)
    end = np.where(some, mask.shape[1] - nz.flip(1).argmax(dim=1).numpy(), 0).astype(np.int64)
    return first, end


def _agree(
    ids: torch.Tensor, responses: torch.Tensor, starts: np.ndarray, rows: Rows
) -> np.ndarray:
    """Per row: ``responses`` are the tokens of ``ids`` from ``starts`` on, wherever both hold
    a real token."""
    b, t = ids.shape
    cols = torch.from_numpy(starts)[:, None] + torch.arange(responses.shape[1])
    real = (cols >= torch.from_numpy(rows.first)[:, None]) & (
        cols < torch.from_numpy(rows.end)[:, None]
    )
    got = ids.gather(1, cols.clamp(0, t - 1))
    return ((got == responses) | ~real).all(dim=1).numpy()  # type: ignore[no-any-return]


def response_starts(
    rows: Rows,
    t: int,
    w: int,
    mask: torch.Tensor | None,
    names: tuple[str, str, str],
    ids: torch.Tensor | None = None,
    responses: torch.Tensor | None = None,
) -> np.ndarray:
    """The column of each row's first response token for ``[B, w]`` entries of a batch ``t``
    wide (see the module doc). ``mask``: the ``[B, w]`` response mask, if the batch has one;
    ``names``: the attention mask's, the response mask's and one ``[B, w]`` entry's, for the
    lines; ``ids`` and ``responses``: ``input_ids`` and the response's token ids, if given."""
    attention, response_mask, entry = names
    gap = np.flatnonzero(rows.end - rows.first != rows.lengths)
    if len(gap):
        i = int(gap[0])
        raise InputError(f"row {i} of {attention} has padding between real tokens, but a [B, {w}] "
                         f"entry ({entry}) holds each row's response, its tokens in one run "
                         "at the row's end")  # fmt: skip
    p = t - w
    verl_starts = np.full(len(rows.end), p, dtype=np.int64)
    verl = (rows.first <= p) & (p <= rows.end)
    inner = bool(((rows.first > 0) & (rows.end < t)).any())  # padded on both sides: verl's
    told = ids is not None and responses is not None
    if mask is None:
        if not verl.all():
            i = int(np.flatnonzero(~verl)[0])
            raise InputError(f"row {i} ({entry} [B, {w}] next to {attention} [B, {t}]) is not in "
                             f"{VERL} in {p} columns, so where its response starts is unknown: "
                             f"give {response_mask} [B, {w}], 1 on its response tokens, or rows "
                             "in verl's layout")  # fmt: skip
        if not (inner or told):
            raise InputError(f"where each row's response starts is ambiguous: no row is padded "
                             f"on both sides, as in {VERL}, and no {response_mask} marks the "
                             f"responses next to {entry} [B, {w}]; give {response_mask} [B, {w}] "
                             f"(1 on its response tokens) or responses [B, {w}] (their token "
                             "ids)")  # fmt: skip
        chosen, other = verl_starts, None
    else:
        first_mark, extent = marked(mask)
        verl_fits = bool(verl.all()) and bool((extent <= rows.end - p).all())
        by_mask = rows.end - extent
        mask_fits = (extent == 0) | (by_mask + first_mark >= rows.first)
        if verl_fits and (inner or not mask_fits.all() or (by_mask == p).all()):
            chosen, other = verl_starts, None
        elif mask_fits.all():
            chosen, other = by_mask, (verl_starts if verl_fits else None)
        else:
            i = int(np.flatnonzero(~mask_fits)[0])
            raise InputError(f"row {i}: {response_mask} marks {extent[i] - first_mark[i]} "
                             "columns ending on its last real token, more than its "
                             f"{rows.lengths[i]} real tokens ({attention}), and the rows are "
                             f"not in {VERL}")  # fmt: skip
    if not told:
        return chosen
    assert ids is not None and responses is not None
    agree = _agree(ids, responses, chosen, rows)
    if agree.all():
        return chosen
    if other is not None and _agree(ids, responses, other, rows).all():
        return other
    i = int(np.flatnonzero(~agree)[0])
    raise InputError(f"row {i}: responses are not its tokens from column {int(chosen[i])}, "
                     f"where its response starts ({RULE[chosen is verl_starts]}); give "
                     f"responses that hold each row's response tokens, or rows in {VERL}")  # fmt: skip


def response_part(
    tokens: dict[str, torch.Tensor],
    rows: Rows,
    t: int,
    names: tuple[str, str],
    ids: torch.Tensor,
) -> tuple[int, np.ndarray] | None:
    """``(W, starts)`` of a batch's per-token entries ``tokens`` (``[B, T]`` or ``[B, W]``):
    the one width of its ``[B, W]`` entries and where each row's response starts
    (:func:`response_starts`); ``None`` when it has none. ``names``: the attention mask's and
    the response mask's."""
    narrow = {k: v.shape[1] for k, v in tokens.items() if v.shape[1] < t and k != PROMPTS}
    prompts = tokens.get(PROMPTS)
    if prompts is not None and prompts.shape[1] == t:
        prompts = None  # one value per token, as any [B, T] entry
    if not narrow and prompts is None:
        return None
    if len(set(narrow.values())) > 1:
        by_width = sorted(narrow.items(), key=lambda kv: kv[1])
        (a, wa), (z, wz) = by_width[0], by_width[-1]
        raise InputError(f"{a} is [B, {wa}] and {z} [B, {wz}]: every [B, W] entry holds one "
                         "value per response token, one W for all (per-sample values: [B])")  # fmt: skip
    w = next(iter(narrow.values())) if narrow else t - tokens[PROMPTS].shape[1]
    entry = next(iter(narrow)) if narrow else PROMPTS
    marks = tokens.get(names[1])
    if marks is not None and marks.shape[1] == t:
        marks = None  # a [B, T] mask: per token as any, no response part of its own
    if marks is not None and marks.dim() != 2:
        raise InputError(f"{names[1]}: {tuple(marks.shape)}, not a [B, {w}] mask of the "
                         "response part")  # fmt: skip
    held = tokens.get(RESPONSES)
    if held is not None and (held.dim() != 2 or held.shape[1] != w):
        held = None
    return w, response_starts(rows, t, w, marks, (*names, entry), ids, held)


__all__ = [
    "PROMPTS",
    "RESPONSES",
    "VERL",
    "Rows",
    "marked",
    "response_part",
    "response_starts",
    "row_spans",
]
