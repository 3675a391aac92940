"""``make demo`` shows learning: its data is learnable (``synth --tokenized --pattern count``)
and its training options make the loss fall within its steps, where random tokens would keep it
at ln(V).

The demo's own synth and train.py options are read from jobs/demo.sh and replayed here on a
smaller dataset (one rank, a dp 1 plan; train.py's ``main`` in this process), once on the
demo's pattern and once on random tokens.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.nn")

from job_helpers import LAUNCH, ROOT, metrics  # noqa: E402
from testkit import cli, load_train  # noqa: E402

pytestmark = pytest.mark.slow


def _options(command: str) -> dict[str, str]:
    """The ``--name value`` options of jobs/demo.sh's line that runs ``command``."""
    text = (ROOT / "jobs" / "demo.sh").read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if command in x)
    words = shlex.split(line)
    return {w: v for w, v in zip(words, words[1:], strict=False) if w.startswith("--") and not v.startswith("--")}  # fmt: skip


def test_the_demo_trains_on_a_learnable_pattern() -> None:
    synth = shlex.split((ROOT / "jobs" / "demo.sh").read_text().split("varpack synth")[1])
    assert synth[synth.index("--pattern") + 1] == "count" and "--tokenized" in synth


@pytest.mark.parametrize("pattern", ["count", "random"])
def test_the_demos_loss_falls_on_its_data_only(tmp_path: Path, pattern: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    demo, train_opts = _options("varpack synth"), _options("jobs/train.py")
    vocab = int(demo["--vocab-size"])
    cli("synth", tmp_path / "tok", "--tokenized", "--pattern", pattern, "--vocab-size", vocab,
        "--dist", "uniform", "--min-len", 64, "--max-len", 256, "-n", 400, "--shards", 1,
        "--seed", demo["--seed"], "-q")  # fmt: skip
    cli(
        "lengths", tmp_path / "tok", tmp_path / "meta", "--arrow-copy", tmp_path / "tok.arrow", "-q"
    )
    cli("plan", tmp_path / "meta", tmp_path / "plan", "--max-tokens", 1024, "--grad-accum", 2,
        "--order", "shuffle", "-q")  # fmt: skip
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    keep = ("--preset", "--vocab-size", "--max-steps", "--lr", "--warmup-steps")
    options = [x for k in keep for x in (k, train_opts[k])]
    code = _trainer().main(["--plan", str(tmp_path / "plan"), "--data", str(tmp_path / "tok.arrow"),
                            "--out", str(tmp_path / "run"), *options, "--log-every", "1"])  # fmt: skip
    assert code == 0
    losses = [m["loss"] for m in metrics(tmp_path / "run")]
    assert len(losses) == int(train_opts["--max-steps"])
    start, end = losses[0], min(losses[-2:])
    assert start == pytest.approx(math.log(vocab), abs=0.3)  # a model that knows nothing yet
    if pattern == "count":
        assert end < math.log(vocab) - 1.5, losses  # learned: more than 1.5 nats down
    else:
        assert end > math.log(vocab) - 0.3, losses  # nothing to learn: it stays up


def _trainer() -> Any:
    return load_train("varpack_jobs_train_demo")
