"""Two gloo processes replay a whole plan under DDP with jobs/train.py (started as torchrun starts
them), and resume, from the checkpoint as it is and through ``varpack replan`` on the same dp (the
same runs serve both: each run costs seconds of start-up per rank)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from plan_helpers import random_lengths, ranks, write_tokens  # noqa: E402
from testkit import cli, write_metadata  # noqa: E402

from varpack.torch.checkpoint import load_checkpoint  # noqa: E402
from varpack.torch.records import Records  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def train(nproc: int, *args: object) -> subprocess.CompletedProcess[str]:
    return ranks(nproc, ROOT / "jobs" / "train.py", *args)


def _records(out: Path) -> list[dict]:
    """The last run segment's record of each rank (one file per rank and segment)."""
    records = Records(out).read()
    last = max(r["first_step"] for r in records)
    return [r for r in records if r["first_step"] == last]


@pytest.mark.slow
def test_two_ranks_replay_the_plan_and_resume(tmp_path) -> None:
    rng = np.random.default_rng(7)
    lens = random_lengths(rng, 80, 2, 40)
    write_tokens(tmp_path / "tok.parquet", list(lens), list(lens.values()), row_group_size=16)
    write_metadata(tmp_path / "meta" / "m.parquet", list(lens), list(lens.values()))
    plan = tmp_path / "plan"  # the real planner: shuffled, balanced, linear LR scaling
    cli("plan", tmp_path / "meta", plan, "--dp", 2, "--grad-accum", 2, "--max-tokens", 96,
        "--pad-multiple", 16, "--order", "shuffle", "--seed", 3, "--lr-scaling", "linear",
        "--base-batch-size", 8, "-q")  # fmt: skip
    num_steps = json.loads((plan / "plan.json").read_text())["num_steps"]
    assert num_steps >= 4
    common = ["--plan", plan, "--data", tmp_path / "tok.parquet", "--record", "--warmup-steps", "2"]

    # Whole plan in one go: both ranks finish all steps, every sample exactly once across ranks.
    full = train(2, *common, "--out", tmp_path / "full")
    recs = _records(tmp_path / "full")
    assert [r["steps_done"] for r in recs] == [num_steps, num_steps]
    seen = recs[0]["sample_ids"] + recs[1]["sample_ids"]
    assert sorted(seen) == sorted(lens)
    assert "tok/s" in full.stdout and "loss" in full.stdout
    # The final line: global tokens (every rank) = all the plan's tokens; each rank's own share.
    done = re.search(r"; ([\d,]+) tokens in all \(global: every rank, .*\), ([\d,]+)(?: \.\. "
                     r"([\d,]+))? per rank \(2 ranks\)", full.stdout)  # fmt: skip
    assert done, full.stdout
    lo, hi = (int((done.group(k) or done.group(2)).replace(",", "")) for k in (2, 3))
    assert int(done.group(1).replace(",", "")) == sum(lens.values()) and lo <= hi < sum(
        lens.values()
    )

    # Stop after 2 steps, resume from the checkpoint: the two halves cover the plan exactly once.
    train(2, *common, "--out", tmp_path / "run", "--max-steps", "2")
    part1 = _records(tmp_path / "run")
    assert [r["cursor"]["step"] for r in part1] == [2, 2]
    shutil.copytree(tmp_path / "run", tmp_path / "replanned")  # the same stop, for the replan
    resumed = train(2, *common, "--out", tmp_path / "run", "--resume")
    assert (
        f"resumed after step 2 (2 of the plan's {num_steps} steps done in epoch 0" in resumed.stdout
    )
    part2 = _records(tmp_path / "run")
    assert [r["steps_done"] for r in part2] == [num_steps, num_steps]
    for r in range(2):  # each rank continues exactly where it stopped
        assert part1[r]["sample_ids"] + part2[r]["sample_ids"] == recs[r]["sample_ids"]
    # ... and ends with the same weights and LR state as the uninterrupted run.
    a = load_checkpoint(tmp_path / "full" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    for k, v in a["model"].items():
        assert torch.allclose(v, b["model"][k], atol=1e-6), k
    assert a["lr"]["last_step"] == b["lr"]["last_step"] == num_steps

    # A replan of the rest on the same dp ends with the uninterrupted run's weights, bit for bit.
    cli("replan", plan, tmp_path / "same", "--from-step", 2, "-q")
    common[1] = tmp_path / "same"
    train(2, *common, "--out", tmp_path / "replanned", "--resume")
    c = load_checkpoint(tmp_path / "replanned" / "checkpoint.pt")
    for k, v in a["model"].items():
        assert torch.equal(v, c["model"][k]), k
    assert c["lr"]["last_step"] == num_steps
