"""The README runs as pasted: its ```bash and ```python blocks, in order, in one scratch directory.

The convention (stated in a comment at the top of README.md): ```bash and ```python blocks are
run; ```console and ```text blocks are shown only (set-up commands such as ``make demo`` and
``source .venv/bin/activate``, the flow diagram). Shell blocks run under ``bash -euo pipefail``
with this interpreter's ``bin`` first on PATH (so ``varpack``, ``python`` and ``mpiexec`` are the
environment's) and this checkout first on PYTHONPATH; Python blocks run with this interpreter.
The test also checks that the five-command block and the trainer loop are among the blocks run,
so the README cannot silently stop being tested.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
RUN = ("bash", "python")
SHOWN = ("console", "text")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)

pytestmark = [pytest.mark.mpi, pytest.mark.torch, pytest.mark.slow]


def blocks() -> list[tuple[str, str]]:
    """Every fenced block of the README as (language, code), in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(README.read_text(encoding="utf-8"))]


def test_every_block_is_run_or_marked_shown() -> None:
    langs = [lang for lang, _ in blocks()]
    unknown = [lang or "(none)" for lang in langs if lang not in RUN + SHOWN]
    assert not unknown, f"README blocks must be fenced as one of {RUN + SHOWN}: {unknown}"
    shown = "\n".join(code for lang, code in blocks() if lang in SHOWN)
    assert "make demo" in shown and "make test" in shown and "source .venv/bin/activate" in shown


def test_the_key_blocks_are_run() -> None:
    run = [code for lang, code in blocks() if lang in RUN]
    five = [c for c in run if all(f"varpack {cmd} " in c for cmd in ("lengths", "check", "plan"))]
    assert five and "mpiexec" in five[0] and "varpack sort" in five[0]
    assert "varpack validate" in five[0] and "--oversize split" in five[0]
    assert "--id-column id" in five[0], "Hugging Face-style ids not used"
    data = [c for c in run if '"id":' in c and '"input_ids":' in c and "write_table" in c]
    assert data, "the Hugging Face-style data step is not run"
    loop = [c for c in run if "PlanLoader" in c and "backward()" in c]
    assert loop and "hf_inputs" in loop[0] and "num_items_in_batch" in loop[0], "HF loop not run"
    assert any(c.lstrip().startswith("torchrun") and "jobs/train.py" in c for c in run)


def test_readme_runs_as_pasted(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        MPLBACKEND="Agg",
    )
    (tmp_path / "jobs").symlink_to(ROOT / "jobs")  # the README's torchrun line names jobs/train.py
    ran = 0
    for i, (lang, code) in enumerate(blocks()):
        if lang not in RUN:
            continue
        script = tmp_path / f"_block{i}.{'sh' if lang == 'bash' else 'py'}"
        script.write_text(code, encoding="utf-8")
        cmd = ["bash", "-euo", "pipefail", str(script)]
        if lang == "python":
            cmd = [sys.executable, str(script)]
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, (
            f"README block {i} ({lang}) exited {proc.returncode}:\n{code}\n"
            f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
        if "--log-by source" in code:  # every rank's sources merged into one line per step
            assert re.search(r"loss by source: \S+ \d+\.\d+ \(", proc.stdout), proc.stdout[-2000:]
        ran += 1
    assert ran >= 4
    for path in ("meta", "sorted/_index.json", "plan/plan.json", "plan/rank-00001.parquet"):
        assert (tmp_path / path).exists(), f"the README's commands did not make {path}"
    assert (tmp_path / "tokens.arrow").is_file() and (tmp_path / "plan.png").is_file()
