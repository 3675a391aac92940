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
