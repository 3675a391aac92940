"""jobs/rl_loop.py's rendezvous has jobs/train.py's deadline (``--timeout``, 600 s): the value
reaches ``init_process_group``, and a rank whose peer never started stops at it in one line,
exit 1, instead of waiting torch's default half hour."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

import torch.distributed as dist  # noqa: E402
from job_helpers import LAUNCH, ROOT, env, finish, free_port  # noqa: E402

RL_LOOP = ROOT / "jobs" / "rl_loop.py"


def rl_loop() -> Any:
    spec = importlib.util.spec_from_file_location("varpack_jobs_rl_loop", RL_LOOP)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Joined(Exception):
    """Raised by the stand-in rendezvous: nothing after it runs."""


@pytest.mark.parametrize(("given", "want"), [([], 660.0), (["--timeout", "7"], 67.0),
                                             (["--timeout", "0.5"], 60.5)])  # fmt: skip
def test_the_timeout_reaches_init_process_group(
    given: list[str], want: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given or not (train.py's 600 s), torch's deadline is the watched one and a minute."""
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def rendezvous(*args: Any, **kw: Any) -> None:
        seen.append((args, kw))
        raise Joined

    monkeypatch.setattr(dist, "init_process_group", rendezvous)
    mod = rl_loop()
    assert mod.parse_args(given).timeout == want - 60
    with pytest.raises(Joined):
        mod.main(given)
    assert seen == [(("gloo",), {"timeout": timedelta(seconds=want)})]


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "inf"])
def test_a_timeout_that_is_no_positive_number_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit) as err:
        rl_loop().parse_args(["--timeout", bad])
    assert err.value.code == 2


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_whose_peer_never_started_stops_at_its_deadline(rank: int) -> None:
    """Rank 0 alone waits for rank 1 to join, rank 1 alone for rank 0 to listen: each stops
    at --timeout 2 with one line naming the rendezvous, exit 1."""
    port = free_port()
    variables = dict(RANK=rank, WORLD_SIZE=2, LOCAL_RANK=0, MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=port)  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(RL_LOOP), "--timeout", "2"], cwd=ROOT,
                            env=env(**variables), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    code, out, err = finish(proc, timeout=240)  # type: ignore[arg-type]
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 1 and not out.strip() and len(lines) == 1, (code, out, err)
    assert lines[0].startswith(
        f"varpack: error: rank {rank}: no word from the other ranks in 2s at the rendezvous "
        f"(127.0.0.1:{port}, 2 ranks): a rank was not launched or cannot reach rank 0 there"
    ), lines[0]
    assert "raise --timeout" in lines[0]
