"""jobs/train.py never hangs on its launch: an environment that cannot make a job is one line
before any rendezvous; every wait for the other ranks ends at its deadline (``--timeout``) or
on a signal, in one line, with the documented exit code; a rank that loses a peer says so in one
line instead of a traceback.

Each case runs train.py as the processes srun or torchrun would start (their variables only);
``finish`` kills any that outlives its generous limit, so a hang fails the test, never stalls it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.nn")

from job_helpers import finish, free_port, make_data, srun_tasks, start  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("hangs"), ("plan", 2))


def _args(data: Path, out: str, *extra: object) -> list[object]:
    return ["--plan", data / "plan", "--data", data / "tok.arrow", "--out", data / out, *extra]


def _one_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


#: launch environments that cannot make a job (the plan is for dp 2), and what each says
WRONG = [
    ({"SLURM_PROCID": 3, "SLURM_NTASKS": 2}, "SLURM_PROCID=3 is not below SLURM_NTASKS=2"),
    ({"WORLD_SIZE": 2}, "WORLD_SIZE is set but RANK is not"),
    ({"RANK": 0, "WORLD_SIZE": 2}, "MASTER_ADDR and MASTER_PORT are not set"),
    ({"RANK": 1, "WORLD_SIZE": 2, "LOCAL_RANK": 2, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 1},
     "LOCAL_RANK=2 does not fit RANK=1"),
    ({"SLURM_PROCID": 0, "SLURM_NTASKS": 3}, "planned for dp 2 and this job has 3 data-parallel"),
    ({"SLURM_PROCID": 0, "SLURM_NTASKS": 1}, "planned for dp 2 and this job has 1 data-parallel rank:"),
]  # fmt: skip


def test_a_launch_that_cannot_make_a_job_is_one_line_before_any_wait(data: Path) -> None:
    """Each would have waited for peers that cannot come (or met the wrong ones): started all
    at once, each ends by itself, in one line, exit 2, having written nothing."""
    procs = [(start(*_args(data, f"wrong-{k}"), **variables), want)
             for k, (variables, want) in enumerate(WRONG)]  # fmt: skip
    for k, (proc, want) in enumerate(procs):
        code, out, err = finish(proc, timeout=240)
        line = _one_line(err)
        assert code == 2 and not out.strip(), (code, out, err)
        assert line.startswith("varpack: error: ") and want in line, line
        assert not (data / f"wrong-{k}").exists()


def test_a_rank_whose_peers_never_come_stops_at_its_deadline(data: Path) -> None:
    """Rank 0 alone waits for clients, rank 1 alone for rank 0: each stops at --timeout."""
    procs = [start(*_args(data, f"alone-{r}", "--timeout", 2), SLURM_PROCID=r, SLURM_NTASKS=2,
                   MASTER_PORT=free_port()) for r in (0, 1)]  # fmt: skip
    for r, proc in enumerate(procs):
        code, out, err = finish(proc, timeout=240)
        line = _one_line(err)
        assert code == 1 and not out.strip(), (code, out, err)
        assert line.startswith(f"varpack: error: rank {r}: no word from the other ranks in 2s at "
                               "the rendezvous (127.0.0.1:"), line  # fmt: skip
        assert "raise --timeout" in line


def _accept(
    server: socket.socket, proc: subprocess.Popen[str], limit: float = 240
) -> socket.socket:
    """Wait until the rank connects to our port (it is then inside the rendezvous); the open
    connection, which says nothing."""
    server.settimeout(1.0)
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            return server.accept()[0]
        except TimeoutError:
            assert proc.poll() is None, "the rank ended before the rendezvous"
    raise AssertionError("the rank never reached the rendezvous")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_a_rank_blocked_in_the_rendezvous_at_once(data: Path, sig: int) -> None:
    """The review's case, with a rank that fits: rank 1 of 2 waits for a rank 0 that never
    answers (a port that accepts and says nothing). A signal ends it at once, in one line."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        proc = start(*_args(data, "blocked"), SLURM_PROCID=1, SLURM_NTASKS=2, MASTER_PORT=port)
        with _accept(server, proc):
            time.sleep(0.5)  # in torch's handshake now (C++): Python's handlers cannot run there
            os.kill(proc.pid, sig)
            code, out, err = finish(proc, timeout=30)  # seconds, not the 600 s deadline
    name = signal.Signals(sig).name
    assert code == 128 + sig and not err.strip(), (code, out, err)
    assert _one_line(out) == (f"[train] rank 1: interrupted ({name}) at the rendezvous "
                              f"(127.0.0.1:{port}, 2 ranks): nothing to save; start it again")  # fmt: skip


def _first_step(proc: subprocess.Popen[str]) -> None:
    """Read rank 0's output until its first step is logged."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("[train] step"):
            return
    raise AssertionError("rank 0 ended before its first step")


def test_a_signal_ends_a_rank_held_by_a_stuck_peer_after_its_grace(data: Path) -> None:
    """Rank 1 stops answering (SIGSTOP) after the first step; rank 0, told to stop, waits for
    it one grace period (10 s and twice its longest step so far: the step's time on a loaded
    machine), then stops in one line:
    128 + SIGTERM, long before its 120 s deadline."""
    ranks = srun_tasks(2, *_args(data, "stuck", "--timeout", 120, "--preset", "small"))
    try:
        _first_step(ranks[0])
        os.kill(ranks[1].pid, signal.SIGSTOP)
        os.kill(ranks[0].pid, signal.SIGTERM)
        code, out, err = finish(ranks[0], timeout=60)
    finally:
        os.killpg(ranks[1].pid, signal.SIGKILL)
        ranks[1].communicate()
    said = [x for x in out.splitlines() if "interrupted" in x]
    assert code == 128 + signal.SIGTERM and len(said) == 1 and "Traceback" not in err, out + err
    assert said[0].startswith("[train] rank 0: interrupted (SIGTERM): ")
    # the grace: 10 s and twice the longest step (seconds on a loaded machine), not the deadline
    grace = re.search(r"within (\d+)s", said[0])
    assert grace and 10 <= int(grace.group(1)) < 120 and "stopped at once" in said[0], said[0]


def test_a_rank_that_loses_its_peer_says_so_in_one_line(data: Path) -> None:
    """Rank 1 is killed outright after the first step: rank 0's next collective fails, and it
    says so in one line (the lost rank's own output would say why), exit 1, no traceback."""
    ranks = srun_tasks(2, *_args(data, "lost", "--preset", "small"))
    _first_step(ranks[0])
    os.kill(ranks[1].pid, signal.SIGKILL)
    ranks[1].communicate()
    code, out, err = finish(ranks[0], timeout=120)
    line = _one_line(err)
    assert code == 1, (code, out, err)
    assert line.startswith("varpack: error: rank 0: ") and "another rank is gone" in line, line
