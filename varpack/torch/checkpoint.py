"""Trainer checkpoints with integrity: one file, a checksum over its payload, refusal in one line.

A checkpoint is ``MAGIC``, the sha256 of the payload (64 hex digits), a newline, then the payload
(``torch.save`` of a dict). It is written to a temporary sibling and renamed into place, so a
crash never leaves half of one; on reading, a flipped bit or a truncation fails the checksum and
is refused before ``torch.load`` sees a byte. The state records the run's model options and the
plan's fingerprint, and :func:`check_run` refuses a resume whose options differ, naming them.
A checkpoint written before the checksum (a bare ``torch.save`` file) is still read.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

from varpack.errors import ConfigError, InputError

MAGIC = b"VPCKPT1 "
_DIGEST = 64
#: keys every checkpoint state holds
KEYS = ("model", "optimizer", "lr", "loader", "steps_done")


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``state`` with its checksum, atomically (temporary sibling, then rename)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(MAGIC + digest + b"\n")
            fh.write(payload)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state saved at ``path``, checked: its checksum, that it loads, and its keys."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{p}: cannot read the checkpoint ({exc.strerror or exc})") from None
    payload = data
    if data.startswith(MAGIC):
        head = len(MAGIC) + _DIGEST + 1
        digest, payload = data[len(MAGIC) : head - 1], data[head:]
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            raise InputError(
                f"{p}: the checkpoint is corrupt (its checksum does not match: truncated or "
                "changed on disk); resume from an earlier copy or start again"
            )
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises many kinds for a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{p}: not a readable checkpoint ({first})") from None
    missing = [k for k in KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise InputError(
            f"{p}: not a checkpoint of jobs/train.py (no {', '.join(missing)}); give the --out "
            "of the run to continue"
        )
    return state


def run_options(args: Any) -> dict[str, Any]:
    """The options of ``jobs/train.py`` a checkpoint must be resumed with (they shape the model
    or its updates): what :func:`check_run` compares."""
    return {k: getattr(args, k) for k in ("preset", "vocab_size", "dtype")}


def check_run(path: str | os.PathLike[str], saved: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse to resume when the options that shape the model or the data changed.

    >>> check_run("c.pt", {"preset": "tiny"}, {"preset": "tiny"})
    >>> check_run("c.pt", {"preset": "tiny"}, {"preset": "small"})
    Traceback (most recent call last):
    varpack.errors.ConfigError: c.pt was saved with --preset tiny, this run has --preset small; resume with the options the run started with
    """
    changed = [k for k in sorted(saved) if k in now and saved[k] != now[k]]
    if changed:
        what = ", ".join(f"--{k.replace('_', '-')} {saved[k]}" for k in changed)
        have = ", ".join(f"--{k.replace('_', '-')} {now[k]}" for k in changed)
        raise ConfigError(
            f"{path} was saved with {what}, this run has {have}; resume with the options the "
            "run started with"
        )


def check_world(plan_dir: str | os.PathLike[str], dp: int, ckpt: Path | None) -> None:
    """Refuse a run whose data-parallel world differs from the plan's dp, with the exact
    ``varpack replan`` command that continues the run's checkpoint ``ckpt`` on ``dp`` ranks
    (``None``: a new run, which needs a plan made for ``dp``)."""
    from varpack.planfile.format import load_plan

    plan = load_plan(plan_dir)
    if plan.dp == dp:
        return
    total = plan.dp * plan.grad_accum
    if ckpt is None or not ckpt.is_file():
        raise ConfigError(
            f"{plan_dir} was planned for dp {plan.dp} and this job has {_ranks(dp)}: launch "
            f"{plan.dp}, or plan again with --dp {dp}"
        )
    step = int(load_checkpoint(ckpt)["loader"]["step"])
    new = f"{Path(plan_dir).as_posix().rstrip('/')}-dp{dp}"
    how = (
        f"varpack replan {plan_dir} {new} --from-step {step} --dp {dp}, then resume with "
        f"--plan {new} --resume"
        if total % dp == 0
        else f"dp x grad-accum is {total}, which {_ranks(dp)} do not divide: launch a divisor of "
        f"{total} ranks (then varpack replan {plan_dir} NEW --from-step {step} --dp N)"
    )
    raise ConfigError(
        f"{plan_dir} was planned for dp {plan.dp} and this job has {_ranks(dp)}; the "
        f"checkpoint {ckpt} stands at step {step}: {how}"
    )


def _ranks(dp: int) -> str:
    return f"{dp} data-parallel rank" + ("" if dp == 1 else "s")
