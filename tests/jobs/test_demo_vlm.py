"""The vision-language demo's flow (jobs/demo_vlm.sh): its data through lengths, sort and plan,
then two ranks training a tiny Qwen2-VL from the plan, with DDP and with FSDP2: the loss falls,
and both give the same losses."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.nn")
pytest.importorskip("transformers")

from job_helpers import ROOT, env, metrics  # noqa: E402
from testkit import cli  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _torchrun(plan: Path, data: Path, out: Path, *extra: str) -> list[dict]:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    cmd = [exe, "--standalone", "--nproc-per-node", "2", str(ROOT / "jobs" / "train_vlm.py"),
           "--plan", str(plan), "--data", str(data), "--out", str(out), "--max-steps", "4",
           "--timeout", "300", *extra]  # fmt: skip
    try:
        proc = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"torchrun still running after 900 s:\n{exc.stdout}\n{exc.stderr}"
        ) from None
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return metrics(out)


def test_two_ranks_train_a_tiny_qwen2_vl_from_the_plan(tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "jobs" / "vlm_demo_data.py"), str(data),
                    "--num-samples", "120", "--seed", "7"], check=True, env=env(), cwd=ROOT)  # fmt: skip
    cli("lengths", data / "tokens", tmp_path / "meta", "--grid-column", "image_grid_thw", "-q")
    cli("sort", tmp_path / "meta", tmp_path / "sorted", "-q")
    cli("plan", tmp_path / "sorted", tmp_path / "plan", "--dp", 2, "--grad-accum", 2,
        "--max-tokens", 1024, "--order", "shuffle", "--seed", 1, "--cost", "flops",
        "--model", data / "model", "-q")  # fmt: skip
    ddp = _torchrun(tmp_path / "plan", data, tmp_path / "ddp")
    losses = [m["loss"] for m in ddp]
    assert len(losses) == 4 and losses[0] > 4.5 and losses[-1] < 0.85 * losses[0], losses
    assert sum(m["images_rank0"] for m in ddp) > 0  # the steps held images
    fsdp = _torchrun(tmp_path / "plan", data, tmp_path / "fsdp", "--fsdp")
    assert [m["loss"] for m in fsdp] == pytest.approx(losses, rel=1e-4)
    # a run never writes over another's metrics, nor into its inputs; a non-empty data dir is
    # not written into either
    for out, message in ((tmp_path / "ddp", "holds a run's metrics.jsonl"),
                         (tmp_path / "plan" / "run", "lies inside the input")):  # fmt: skip
        proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "train_vlm.py"), "--plan",
                               str(tmp_path / "plan"), "--data", str(data), "--out", str(out)],
                              env=env(), cwd=ROOT, capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "vlm_demo_data.py"), str(data)],
                          env=env(), cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2 and "is not empty" in proc.stderr
