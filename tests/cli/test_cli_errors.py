"""CLI error handling: a user mistake is one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_cli_user_error_is_one_line_exit_2(tmp_path: Path) -> None:
    """A user mistake prints exactly one line on stderr, no traceback, exit code 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "varpack", "check", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("varpack: error:") and "missing" in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_reader_that_closes_the_pipe_is_not_a_path_error(tmp_path: Path) -> None:
    """``varpack check meta/ | head -1``-style use: the reader goes away (here before the
    first line). The command ends quietly with SIGPIPE's exit status, not with "check the
    path"."""
    meta = tmp_path / "meta"
    subprocess.run([sys.executable, "-m", "varpack", "synth", str(meta), "-n", "2000"], check=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "varpack", "check", str(meta)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command prints
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "permissions" not in err and "Traceback" not in err
