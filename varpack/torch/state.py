"""The loader's resume state: what :meth:`PlanLoader.state_dict` returns, and its checks.

The state is a small dict a trainer keeps in its checkpoint::

    {"format": "varpack.loader", "version": 2, "plan": "<fingerprint>",
     "epoch": E, "step": S, "micro": M, "checksum": "<sha256>"}

``plan`` ties it to one plan (a re-planned run has another fingerprint), ``(epoch, step,
micro)`` is the cursor of the next micro-batch, and ``checksum`` is a sha256 over the other
keys, so a flipped bit that leaves every value in range (step 5 read as step 7) is refused
instead of silently skipping data. :func:`read_state` refuses, in one line each, a state that is
not a dict, of another format or a newer version, from another plan, with a value out of range,
or with a checksum that does not match. A state of version 1 (written before the checksum) is
still read. A replanned plan (``varpack replan``) also takes its parent's state taken at the step
it continues from (:func:`read_parent_state`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

from varpack.errors import InputError

STATE_FORMAT = "varpack.loader"
STATE_VERSION = 2
#: the keys the checksum covers, in the state's order
FIELDS = ("format", "version", "plan", "epoch", "step", "micro")
_DAMAGED = "the checkpoint is damaged or belongs to another run"


def make_state(plan: str, epoch: int, step: int, micro: int) -> dict[str, Any]:
    """A sealed state (with its checksum)."""
    state = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "plan": plan,
        "epoch": int(epoch),
        "step": int(step),
        "micro": int(micro),
    }
    return seal(state)


def seal(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with the checksum of its :data:`FIELDS` (re-sealing one edited on purpose)."""
    return {**state, "checksum": state_checksum(state)}


def state_checksum(state: Mapping[str, Any]) -> str:
    """sha256 over a canonical JSON of the state's :data:`FIELDS`."""
    body = {k: state.get(k) for k in FIELDS}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()


def _plain(value: Any) -> Any:
    """A NumPy integer as the int it is; anything else by its repr (it never matches)."""
    return int(value) if isinstance(value, np.integer) else repr(value)


def read_state(
    state: Any, fingerprint: str, num_steps: int, grad_accum: int, where: str = "this plan"
) -> tuple[int, int, int]:
    """``(epoch, step, micro)`` of a state taken on the plan with ``fingerprint`` (the plan
    directory ``where``), checked."""
    if not isinstance(state, Mapping):
        raise InputError(
            f"not a varpack loader state (a {type(state).__name__}, not a dict); {_DAMAGED}"
        )
    version: Any = state.get("version")
    if state.get("format") != STATE_FORMAT or not _is_int(version) or version < 1:
        raise InputError(
            f"not a varpack loader state (format {state.get('format')!r}, version {version!r})"
        )
    if version > STATE_VERSION:
        raise InputError(
            f"the loader state is of version {version}, written by a newer varpack (this one "
            f"reads 1 to {STATE_VERSION}); upgrade varpack"
        )
    # version 1 had no checksum (one that holds a checksum anyway is checked)
    recorded = state.get("checksum")
    sealed = recorded == state_checksum(state) or (version < 2 and recorded is None)
    if state.get("plan") != fingerprint:
        if not sealed:
            _damaged()
        raise InputError(
            f"the loader state belongs to another plan (fingerprint {state.get('plan')}, "
            f"{where} is {fingerprint}); resume with the plan the run started with"
        )
    epoch = _state_int(state, "epoch", 0, 2**62)
    step = _state_int(state, "step", 0, num_steps)  # num_steps: the plan is done
    micro = _state_int(state, "micro", 0, grad_accum - 1)
    if step == num_steps and micro:
        raise InputError(f"loader state step {step} micro {micro}: the plan has {step} steps")
    if not sealed:
        _damaged()
    return epoch, step, micro


def read_parent_state(
    state: Mapping[str, Any], parent: Mapping[str, Any], num_steps: int, dp: int
) -> tuple[int, int, int]:
    """``(epoch, step, micro)`` of a state taken on a replanned plan's ``parent`` (plan.json's
    entry): it must stand at the step the plan continues from, else the fitting ``varpack
    replan`` command is named. ``num_steps``: the run's steps; ``dp``: the plan's."""
    first = int(parent["from_step"])
    epoch, step, micro = read_state(
        state, str(parent["plan_fingerprint"])[:32], num_steps, 2**31, str(parent["plan"])
    )
    if (step, micro) != (first, 0):
        where = f"step {step}" + (f" micro {micro}" if micro else "")
        raise InputError(
            f"the checkpoint was taken at {where} of the parent plan {parent['plan']}, and this "
            f"plan continues it from step {first}: replan from the checkpoint's step (varpack "
            f"replan {parent['plan']} NEW --from-step {step} --dp {dp})"
        )
    return epoch, step, micro


def _damaged() -> NoReturn:
    raise InputError(
        "the loader state's checksum does not match its content (changed after it was taken); "
        f"{_DAMAGED}: resume from an earlier copy"
    )


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | np.integer)


def _state_int(state: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    """An integer field of a loader state within ``[lo, hi]`` (not a bool, float or string)."""
    value: Any = state.get(key)
    if not _is_int(value) or not lo <= value <= hi:
        raise InputError(
            f"loader state {key} {value!r}: must be an integer in [{lo}, {hi}]; {_DAMAGED}"
        )
    return int(value)
