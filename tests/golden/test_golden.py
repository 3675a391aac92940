"""Behaviour pinned: the demo flow and a plan per option family give the recorded outputs.

``hashes.json`` holds the content hash of every output (see ``record.py``). A change that moves
code must leave every one of them unchanged; a change that means to alter a plan re-records them
(``python tests/golden/record.py /tmp/golden > tests/golden/hashes.json``) and says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow
def test_outputs_match_the_recorded_hashes(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(HERE / "record.py"), str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    want = json.loads((HERE / "hashes.json").read_text())
    assert sorted(got) == sorted(want), "the set of output files changed"
    changed = [name for name in want if got[name] != want[name]]
    assert not changed, f"outputs differ from the recorded ones: {changed}"
