"""What a training run writes about itself in its ``OUT``: ``metrics.jsonl`` and the ``--record``
files, both numbered by the one step count of the run.

**Steps.** Step ``S`` is the run's ``S``-th optimizer step, counted from 1 across resumes: the
log line ``step S``, ``metrics.jsonl``'s ``step``, ``--max-steps`` and a checkpoint's
``steps_done`` (the last step it holds) all mean the same. The plan's own 0-based index of the
step is ``plan_step`` (it restarts with each pass over the plan, and a replanned plan goes on
from its parent's).

- :class:`MetricsLog`: ``OUT/metrics.jsonl``, one JSON object per logged step, written by rank 0.
- the lines that name steps: :func:`resumed_line`, :func:`interrupted_line`, and what an early
  stop leaves (:func:`keep`).
- :class:`Records`: ``OUT/record-steps-A-B-rank-R.json``, the sample ids rank ``R`` trained in
  steps ``A`` to ``B`` of the run: one file per rank per run segment (a start or a resume), so a
  resume on another world size adds its own files and overwrites none.

Both forget what a resumed run trains again: on ``--resume`` from step ``S``, the metric lines
and record files past step ``S`` are dropped; a new run starts both afresh (record files left
by an earlier run in ``OUT`` are removed). So every file in ``OUT`` belongs to the run its
checkpoint continues.

Imports: nothing of varpack's.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any, Protocol

#: a record file's name: the run's steps it covers (1-based, inclusive) and the rank
RECORD = re.compile(r"record-steps-(\d+)-(\d+)-rank-(\d+)\.json")
_ANY_RECORD = "record-*.json"  # earlier names (record-rank-R.json) included


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and the word, in the number it takes.

    >>> plural(1, "rank"), plural(2, "step"), plural(0, "shape"), plural(1_000, "token")
    ('1 rank', '2 steps', '0 shapes', '1,000 tokens')
    """
    return f"{n:,} {word if n == 1 else many or word + 's'}"


class MetricsLog:
    """``OUT/metrics.jsonl``: one JSON object per logged step, written by rank 0 line by line
    and flushed (a crash loses at most the line being written). A new run starts the file; a
    resumed one appends, after dropping the lines past the checkpoint's step (those steps are
    trained again and logged again)."""

    def __init__(self, path: Path, resumed_at: int | None, enabled: bool) -> None:
        self.path = path
        self._file = None
        if not enabled:
            return
        if resumed_at is not None and path.is_file():
            lines = path.read_text().splitlines()
            keep = [x for x in lines if 0 <= _step_of(x) <= resumed_at]
            if len(keep) != len(lines):
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text("".join(x + "\n" for x in keep))
                os.replace(tmp, path)
        self._file = path.open("a" if resumed_at is not None else "w")

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _step_of(line: str) -> int:
    """The line's ``step``; -1 for a line that is not a record (one cut short by a crash)."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return -1
    return step if isinstance(step, int) else -1


class Records:
    """The ``--record`` files of a run's ``OUT`` (see the module's docstring)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def forget(self, resumed_at: int | None) -> list[Path]:
        """Remove the record files a run starting here must not leave looking current: all of
        them for a new run (``None``), those reaching past step ``resumed_at`` for a resume,
        and any of an earlier naming (their steps are unknown). Rank 0 calls it, before the
        first step. Returns what it removed."""
        gone = []
        for path in sorted(self.out.glob(_ANY_RECORD)):
            m = RECORD.fullmatch(path.name)
            if resumed_at is None or m is None or int(m.group(2)) > resumed_at:
                path.unlink(missing_ok=True)
                gone.append(path)
        return gone

    def write(self, rank: int, world: int, first: int, last: int, ids: list[int],
              cursor: dict[str, Any]) -> Path | None:  # fmt: skip
        """Rank ``rank``'s record of steps ``first`` to ``last`` (none when it trained no step),
        written whole or not at all."""
        if last < first:
            return None
        path = self.out / f"record-steps-{first}-{last}-rank-{rank}.json"
        record = {"rank": rank, "world": world, "first_step": first, "steps_done": last,
                  "sample_ids": ids, "cursor": cursor}  # fmt: skip
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
        return path

    def read(self) -> list[dict[str, Any]]:
        """Every record of the run, in step order, then rank order."""
        found = [(RECORD.fullmatch(p.name), p) for p in self.out.glob(_ANY_RECORD)]
        keyed = sorted((int(m.group(1)), int(m.group(3)), p) for m, p in found if m)
        return [json.loads(p.read_text()) for _, _, p in keyed]


class _Watch(Protocol):
    kept: str


def where(cursor: dict[str, Any], num_steps: int) -> str:
    """A loader's cursor in words (the plan's steps are 0-based: ``P`` done, step ``P`` next).

    >>> where({"step": 2, "epoch": 0}, 10)
    "2 of the plan's 10 steps done in epoch 0"
    """
    return f"{cursor['step']} of the plan's {num_steps} steps done in epoch {cursor['epoch']}"


def resumed_line(steps: int, cursor: dict[str, Any], num_steps: int, left: int) -> str:
    """
    >>> resumed_line(2, {"step": 2, "epoch": 0}, 3, 1)
    "resumed after step 2 (2 of the plan's 3 steps done in epoch 0, 1 step left in this pass)"
    """
    return (
        f"resumed after step {steps} ({where(cursor, num_steps)}, {plural(left, 'step')} "
        "left in this pass)"
    )


def keep(watch: _Watch | None, ckpt: Path, saved_at: int, steps: int) -> str:
    """What an early stop leaves (for the watch's lines, and a lost rank's), given the step the
    checkpoint holds (-1: none) and the steps done."""
    kept = (
        f"{ckpt} holds step {saved_at}; resume with --resume"
        if saved_at > 0
        else "no checkpoint yet: start it again"
        if steps
        else "nothing to save; start it again"
    )
    if watch is not None:
        watch.kept = kept
    return kept


def interrupted_line(signum: int, cursor: dict[str, Any], num_steps: int, ckpt: Path,
                     fresh: bool, steps: int) -> str:  # fmt: skip
    """What an interrupted run did with its state, and how to go on (rank 0 says it once)."""
    name = signal.Signals(signum).name
    if steps == 0:
        return f"interrupted ({name}) before the first step: nothing to save; start it again"
    kept = f"saved {ckpt}" if fresh else f"{ckpt} already holds it"
    where_ = where(cursor, num_steps)
    return f"interrupted ({name}) after step {steps} ({where_}): {kept}; resume with --resume"


__all__ = [
    "RECORD",
    "MetricsLog",
    "Records",
    "interrupted_line",
    "keep",
    "plural",
    "resumed_line",
    "where",
]
