"""``varpack.torch.watch``: each rule of the watch in a small process of its own (no torch): a
wait past its deadline, a signal before the first step, a step or a wait past its grace period,
a save never cut short, a second signal, a forked child's signals kept apart. The trainer's own
cases are in tests/jobs/test_launch_hangs.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HEAD = """
import os, signal, sys, threading, time, types
import varpack
# varpack.torch's modules without the package's __init__ (which imports torch): the watch and
# the launch environment need none, and each case starts in a fraction of a second
pkg = types.ModuleType("varpack.torch")
pkg.__path__ = [os.path.join(os.path.dirname(varpack.__file__), "torch")]
sys.modules["varpack.torch"] = pkg
from varpack.torch.watch import Watch, holding, waiting
signal.signal(signal.SIGTERM, lambda *a: None)  # noted only, as StopRequest does
def kill(after, sig=signal.SIGTERM):
    threading.Timer(after, lambda: os.kill(os.getpid(), sig)).start()
watch = Watch(timeout=float(sys.argv[1]), rank=int(sys.argv[2]), world=2).start()
watch.kept = "KEPT"
"""


def run(body: str, timeout: float = 5, rank: int = 0, tmp: Path | None = None):  # type: ignore[no-untyped-def]
    code = HEAD + textwrap.dedent(body) + "\nprint('ended by itself', flush=True)\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-c", code, str(timeout), str(rank)], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp or ROOT)  # fmt: skip


def test_a_wait_past_its_deadline_ends_in_one_line() -> None:
    proc = run("""
        with waiting("the step's stop flag", "HINT"):
            time.sleep(20)
    """, timeout=1, rank=1)  # fmt: skip
    assert proc.returncode == 1 and not proc.stdout, proc
    assert proc.stderr == (
        "varpack: error: rank 1: no word from the other ranks in 1s at the step's stop flag: "
        "HINT; KEPT; raise --timeout if this wait may take longer\n"
    )


def test_a_signal_before_the_first_step_ends_at_once() -> None:
    proc = run("""
        kill(0.3)
        with waiting("the rendezvous (h:1, 2 ranks)", everyone=True):
            time.sleep(20)
    """, timeout=60, rank=1)  # fmt: skip
    assert proc.returncode == 143 and not proc.stderr, proc
    assert (
        proc.stdout
        == "[train] rank 1: interrupted (SIGTERM) at the rendezvous (h:1, 2 ranks): KEPT\n"
    )
    # past the rendezvous, before the first step: rank 0 says it, another rank only stops
    quiet = run("kill(0.3)\ntime.sleep(20)\n", timeout=60, rank=1)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (143, "", "")
    said = run("kill(0.3)\ntime.sleep(20)\n", timeout=60, rank=0)
    assert said.stdout == "[train] rank 0: interrupted (SIGTERM) before the first step: KEPT\n"


def test_a_step_that_does_not_end_within_its_grace_is_cut_short() -> None:
    proc = run("""
        watch.training(); watch.step = 4
        kill(0.2)
        time.sleep(20)  # the step: a peer never answers
    """, timeout=1)  # fmt: skip
    assert proc.returncode == 143, proc
    assert proc.stdout == ("[train] rank 0: interrupted (SIGTERM): step 5 did not end within 1s of "
                           "the signal (a rank is stuck or gone): stopped at once; KEPT\n")  # fmt: skip


def test_a_step_that_ends_within_its_grace_goes_on() -> None:
    """The signal is the trainer's to honour at the step's end: the watch lets it be."""
    proc = run("""
        watch.training()
        kill(0.1)
        time.sleep(0.6)
        watch.agreed()
        with waiting("the barrier after the checkpoint"):
            time.sleep(0.5)
    """, timeout=2)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "ended by itself\n", proc


def test_after_the_agreement_each_wait_has_its_own_grace() -> None:
    proc = run("""
        watch.training()
        kill(0.1)
        time.sleep(0.5)
        watch.agreed()
        time.sleep(2.5)  # the last step and its save, past the signal's grace: agreed, so on
        with waiting("the final figures"):
            time.sleep(20)
    """, timeout=2)  # fmt: skip
    assert proc.returncode == 143, proc
    assert proc.stdout == ("[train] rank 0: interrupted (SIGTERM): the other ranks did not reach "
                           "the final figures within 2s: stopped at once; KEPT\n")  # fmt: skip


def test_a_checkpoint_being_written_is_never_cut_short(tmp_path: Path) -> None:
    proc = run("""
        watch.training()
        kill(0.1)
        with holding():
            time.sleep(3)  # far past the grace period (2 s)
            open("saved", "w").write("whole")
        time.sleep(0.5)  # the grace period counts from the save's end
        watch.agreed()
        print("agreed", flush=True)
    """, timeout=2, tmp=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "agreed\nended by itself\n", proc
    assert (tmp_path / "saved").read_text() == "whole"


def test_a_second_signal_stops_at_once_and_a_repeat_does_not() -> None:
    twice = run("""
        watch.training()
        kill(0.1); kill(1.4)
        time.sleep(1.8)
        watch.agreed()
        time.sleep(20)
    """, timeout=60)  # fmt: skip
    assert twice.returncode == 143, twice
    assert twice.stdout == "[train] rank 0: interrupted (SIGTERM twice): stopped at once; KEPT\n"
    # the same signal again at once (its process group and its launcher): one signal
    once = run("""
        watch.training()
        kill(0.1); kill(0.15)
        time.sleep(1.5)
        watch.agreed()
    """, timeout=60)  # fmt: skip
    assert once.returncode == 0 and once.stdout == "ended by itself\n", once


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_childs_signals_are_its_own() -> None:
    """A DataLoader worker (forked) that gets a signal does not tell the parent's watch."""
    proc = run("""
        watch.training()
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(1.5)  # past the grace period: had the watch seen it, it would have fired
    """, timeout=1)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "ended by itself\n", proc
